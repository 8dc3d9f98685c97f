package robustness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// leaseProbe checks that leases expire exactly once under faults. It works
// on a keyspace of its own (etcd's validators model no expiry: a revision
// an expiry takes would look like a write nobody made), served by two
// replicas that share lease expiry. It keeps granting short leases, puts
// two keys on each and never keeps them alive; a watch records every event.
// Then every key put must be deleted exactly once, never before its
// lease's TTL has passed, and the keyspace's persisted history must revoke
// each lease at most once.
type leaseProbe struct {
	cli         *clientv3.Client
	stopGrants  context.CancelFunc
	stopWatch   context.CancelFunc
	grants, wch sync.WaitGroup

	mu      sync.Mutex
	granted map[int64]probeGrant    // guarded by mu
	events  map[string][]probeEvent // guarded by mu: by key
	lastRev int64                   // guarded by mu: the watch's progress
	errs    map[string]int          // guarded by mu: failed probe requests by error
}

type probeGrant struct {
	called time.Time // before the Grant request was sent
	ttl    int64
}

type probeEvent struct {
	at    time.Time
	put   bool
	lease int64
	rev   int64
}

const (
	probeTTL   = 2 // seconds: the least fdb-etcd grants with etcd's default timing
	probeEvery = 300 * time.Millisecond
)

func startLeaseProbe(endpoints []string) (*leaseProbe, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	p := &leaseProbe{cli: cli, granted: map[int64]probeGrant{}, events: map[string][]probeEvent{}, errs: map[string]int{}}
	wctx, wcancel := context.WithCancel(context.Background())
	gctx, gcancel := context.WithCancel(context.Background())
	p.stopWatch, p.stopGrants = wcancel, gcancel
	p.wch.Add(1)
	go p.watch(wctx)
	p.grants.Add(1)
	go p.grantLoop(gctx)
	return p, nil
}

// watch records every event under probe/ from the first revision on; a
// watch that ends is resumed after the last revision it delivered.
func (p *leaseProbe) watch(ctx context.Context) {
	defer p.wch.Done()
	for ctx.Err() == nil {
		p.mu.Lock()
		from := p.lastRev + 1
		p.mu.Unlock()
		wch := p.cli.Watch(clientv3.WithRequireLeader(ctx), "probe/", clientv3.WithPrefix(), clientv3.WithRev(from))
		for resp := range wch {
			if resp.Err() != nil {
				p.failed(resp.Err())
				break
			}
			now := time.Now()
			p.mu.Lock()
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				p.events[k] = append(p.events[k], probeEvent{at: now, put: ev.Type == mvccpb.PUT, lease: ev.Kv.Lease, rev: ev.Kv.ModRevision})
				p.lastRev = ev.Kv.ModRevision
			}
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *leaseProbe) grantLoop(ctx context.Context) {
	defer p.grants.Done()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(probeEvery):
		}
		called := time.Now()
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		g, err := p.cli.Grant(gctx, probeTTL)
		gcancel()
		if err != nil {
			p.failed(err)
			continue
		}
		p.mu.Lock()
		p.granted[int64(g.ID)] = probeGrant{called: called, ttl: g.TTL}
		p.mu.Unlock()
		for _, k := range []string{"a", "b"} {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := p.cli.Put(pctx, fmt.Sprintf("probe/%d/%s", n, k), "v", clientv3.WithLease(g.ID))
			pcancel()
			if err != nil {
				p.failed(err)
			}
		}
	}
}

func (p *leaseProbe) failed(err error) {
	if err == nil || err == context.Canceled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs[err.Error()]++
}

// probeResult is what finish found.
type probeResult struct {
	grants, keys, expired int
	maxDelay              time.Duration
	problems              []string
	errs                  map[string]int
}

// finish stops granting, waits until every key put so far has expired
// (bounded by wait), stops the watch and checks the events.
func (p *leaseProbe) finish(wait time.Duration) probeResult {
	p.stopGrants()
	p.grants.Wait()
	deadline := time.Now().Add(probeTTL*time.Second + wait)
	for time.Now().Before(deadline) && !p.allExpired() {
		time.Sleep(200 * time.Millisecond)
	}
	p.stopWatch()
	p.wch.Wait()
	_ = p.cli.Close()
	return p.check()
}

func (p *leaseProbe) allExpired() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, evs := range p.events {
		if evs[len(evs)-1].put {
			return false
		}
	}
	return true
}

func (p *leaseProbe) check() probeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := probeResult{grants: len(p.granted), keys: len(p.events), errs: p.errs}
	keys := make([]string, 0, len(p.events))
	for k := range p.events {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		evs := p.events[k]
		if len(evs) != 2 || !evs[0].put || evs[1].put {
			r.problems = append(r.problems, fmt.Sprintf("%s: events %s, want one put and one delete", k, describeProbe(evs)))
			continue
		}
		r.expired++
		g, ok := p.granted[evs[0].lease]
		if !ok {
			continue // the grant's answer was lost; its TTL start is unknown
		}
		due := g.called.Add(time.Duration(g.ttl) * time.Second)
		if evs[1].at.Before(due) {
			r.problems = append(r.problems, fmt.Sprintf("%s: deleted %v before its lease %x could expire", k, due.Sub(evs[1].at), evs[0].lease))
		}
		r.maxDelay = max(r.maxDelay, evs[1].at.Sub(due))
	}
	return r
}

func describeProbe(evs []probeEvent) string {
	var b strings.Builder
	for _, e := range evs {
		kind := "delete"
		if e.put {
			kind = "put"
		}
		fmt.Fprintf(&b, "[%s at %d] ", kind, e.rev)
	}
	return b.String()
}

// checkRevokes reads the lease keyspace's exported history: no lease may be
// revoked twice, and every probe lease whose keys expired must be revoked.
func (r *probeResult) checkRevokes(export []byte, leaseOf map[string]int64) {
	revokes := map[int64]int{}
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(make([]byte, 64<<20), 64<<20)
	for sc.Scan() {
		var p persistedRequest
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			r.problems = append(r.problems, "lease keyspace export: "+err.Error())
			return
		}
		if p.Type == "leaseRevoke" {
			revokes[p.LeaseID]++
		}
	}
	for id, n := range revokes {
		if n > 1 {
			r.problems = append(r.problems, fmt.Sprintf("lease %x revoked %d times", id, n))
		}
	}
	for key, id := range leaseOf {
		if revokes[id] == 0 {
			r.problems = append(r.problems, fmt.Sprintf("%s expired but its lease %x was never revoked", key, id))
		}
	}
}

// expiredLeases maps each key that expired to its lease.
func (p *leaseProbe) expiredLeases() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int64{}
	for k, evs := range p.events {
		if len(evs) == 2 && evs[0].put && !evs[1].put {
			out[k] = evs[0].lease
		}
	}
	return out
}
