//go:build fdb

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// metric reads one series of r's /metrics, 0 if absent.
func (r *replica) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// ownership is what a replica's metrics say about its part in the owner's
// work: whether it owns lease expiry, how many leases it expired, how many
// writes it forwarded, how many storage conflicts it met.
type ownership struct {
	owner                         bool
	expired, forwarded, conflicts float64
	// local: writes committed here because the owner was unreachable;
	// yielded: those of them that gave way to a new owner (forward).
	local, yielded float64
}

func (r *replica) ownership(t *testing.T) ownership {
	return ownership{
		owner:     r.metric(t, "fdb_etcd_lease_expiry_owner") == 1,
		expired:   r.metric(t, "fdb_etcd_lease_expired_total"),
		forwarded: r.metric(t, `fdb_etcd_forward_writes_total{result="ok"}`),
		local:     r.metric(t, `fdb_etcd_forward_writes_total{result="local"}`),
		yielded:   r.metric(t, `fdb_etcd_forward_writes_total{result="yielded"}`),
	}
}

// waitOwner returns the replica that owns lease expiry, waiting up to 30 s.
func waitOwner(t *testing.T, reps []*replica) *replica {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range reps {
			if r.leaseOwner(t) {
				return r
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no replica took lease expiry ownership in 30 s")
	return nil
}

// deletions records when a watcher on prefix saw each key deleted.
type deletions struct {
	mu sync.Mutex
	at map[string]time.Time
}

func watchDeletions(ctx context.Context, t *testing.T, cli *clientv3.Client, prefix string) *deletions {
	d := &deletions{at: map[string]time.Time{}}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithFilterPut())
	go func() {
		for wr := range wch {
			now := time.Now()
			if err := wr.Err(); err != nil && ctx.Err() == nil {
				t.Errorf("watch %s: %v", prefix, err)
				return
			}
			d.mu.Lock()
			for _, ev := range wr.Events {
				d.at[string(ev.Kv.Key)] = now
			}
			d.mu.Unlock()
		}
	}()
	return d
}

func (d *deletions) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.at)
}

// writers runs n put loops spread over reps until stop is called, which
// returns the puts each replica acknowledged.
func writers(ctx context.Context, t *testing.T, reps []*replica, n int, tag string) (stop func() []int) {
	counts := make([]int, len(reps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	for w := range n {
		ri := w % len(reps)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; wctx.Err() == nil; i++ {
				_, err := reps[ri].cli.Put(wctx, fmt.Sprintf("load/%s/%d/%d", tag, w, i), "v")
				if err != nil {
					if wctx.Err() == nil {
						t.Errorf("put through %s: %v", reps[ri].name, err)
					}
					return
				}
				mu.Lock()
				counts[ri]++
				mu.Unlock()
			}
		}()
	}
	return func() []int {
		cancel()
		wg.Wait()
		return counts
	}
}

// grantLeases grants n leases of ttl at an even rate over d, round robin over
// reps, each holding one key under prefix; it returns each key's deadline
// as seen before its grant was sent (an upper bound on the true one's
// lateness).
func grantLeases(ctx context.Context, t *testing.T, reps []*replica, n int, d, ttl time.Duration, prefix string) map[string]time.Time {
	deadlines := map[string]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	tick := time.NewTicker(d / time.Duration(n))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		r := reps[i%len(reps)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s%d", prefix, i)
			before := time.Now()
			l, err := r.cli.Grant(ctx, int64(ttl/time.Second))
			if err == nil {
				_, err = r.cli.Put(ctx, key, "v", clientv3.WithLease(l.ID))
			}
			if err != nil {
				t.Errorf("lease %d through %s: %v", i, r.name, err)
				return
			}
			mu.Lock()
			deadlines[key] = before.Add(ttl)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return deadlines
}

// phase is one measured stretch of load.
type phase struct {
	name          string
	reps          []*replica
	leases        int
	took          time.Duration
	puts          []int
	lateness      []time.Duration // sorted
	before, after []ownership
}

// runPhase runs n writers over reps while leases (granted evenly over d,
// TTL ttl) expire, until a watcher has seen every leased key deleted.
func runPhase(ctx context.Context, t *testing.T, name string, reps []*replica, n, leases int, d, ttl time.Duration) *phase {
	t.Helper()
	p := &phase{name: name, reps: reps, leases: leases}
	for _, r := range reps {
		p.before = append(p.before, r.ownership(t))
	}
	prefix := "leased/" + name + "/"
	dels := watchDeletions(ctx, t, reps[len(reps)-1].cli, prefix)
	start := time.Now()
	stop := writers(ctx, t, reps, n, name)
	deadlines := grantLeases(ctx, t, reps, leases, d, ttl, prefix)
	limit := time.Now().Add(ttl + time.Minute)
	for dels.count() < len(deadlines) && time.Now().Before(limit) && !t.Failed() {
		time.Sleep(100 * time.Millisecond)
	}
	p.puts, p.took = stop(), time.Since(start)
	for _, r := range reps {
		p.after = append(p.after, r.ownership(t))
	}
	if t.Failed() {
		t.FailNow()
	}
	dels.mu.Lock()
	defer dels.mu.Unlock()
	for key, deadline := range deadlines {
		at, ok := dels.at[key]
		if !ok {
			t.Fatalf("%s: %s not deleted %v after the last grant (%d of %d leases expired)", name, key, ttl+time.Minute, len(dels.at), len(deadlines))
		}
		p.lateness = append(p.lateness, at.Sub(deadline))
	}
	slices.Sort(p.lateness)
	return p
}

func (p *phase) report(t *testing.T) {
	total := 0
	for _, n := range p.puts {
		total += n
	}
	over := 0
	for _, l := range p.lateness {
		if l > time.Second {
			over++
		}
	}
	q := func(f float64) time.Duration {
		return p.lateness[int(f*float64(len(p.lateness)-1))].Round(time.Millisecond)
	}
	t.Logf("%s: %d puts in %v (%.0f/s)", p.name, total, p.took.Round(time.Second), float64(total)/p.took.Seconds())
	for i, r := range p.reps {
		b, a := p.before[i], p.after[i]
		t.Logf("  %s: %d puts (%.1f%%), owner %t, expired %.0f leases, forwarded %.0f writes (%.0f committed here, owner unreachable; %.0f of them yielded)",
			r.name, p.puts[i], 100*float64(p.puts[i])/float64(total), a.owner, a.expired-b.expired, a.forwarded-b.forwarded,
			a.local-b.local, a.yielded-b.yielded)
	}
	t.Logf("  %d leases: revoke seen by a watcher after its deadline p50 %v, p99 %v, max %v; %d later than 1 s",
		len(p.lateness), q(0.5), q(0.99), q(1), over)
}

// check asserts behaviour only: every replica made progress, and every
// lease was expired by the replica the others forward their writes to.
func (p *phase) check(t *testing.T) {
	t.Helper()
	total := 0
	for _, n := range p.puts {
		total += n
	}
	owners := 0
	for i, r := range p.reps {
		if p.puts[i] == 0 || float64(p.puts[i]) < 0.1*float64(total)/float64(len(p.reps)) {
			t.Errorf("%s: %s starved: %d of %d puts", p.name, r.name, p.puts[i], total)
		}
		b, a := p.before[i], p.after[i]
		if !a.owner {
			if a.expired != b.expired {
				t.Errorf("%s: %s expired %.0f leases without owning writes", p.name, r.name, a.expired-b.expired)
			}
			continue
		}
		owners++
		if a.forwarded != b.forwarded {
			t.Errorf("%s: %s owns lease expiry but forwarded %.0f writes to another owner", p.name, r.name, a.forwarded-b.forwarded)
		}
		if int(a.expired-b.expired) != p.leases {
			t.Errorf("%s: the owner %s expired %.0f of %d leases", p.name, r.name, a.expired-b.expired, p.leases)
		}
	}
	if owners != 1 {
		t.Errorf("%s: %d replicas own lease expiry, want 1", p.name, owners)
	}
}

var expiryWindow = flag.Duration("expiry-window", 20*time.Second,
	"how long TestOwnerCommitsWritesAndExpiry grants leases before the failover (half as long after it)")

// TestOwnerCommitsWritesAndExpiry measures three replicas on one
// FoundationDB keyspace under 16 writers while 1,000 leases a minute
// expire, then the two left after the owner is killed: each replica's share
// of the writes, and how late each revoke is after its deadline. It asserts
// behaviour only (every replica progresses; the write owner, and only it,
// expires the leases); the numbers are logged.
func TestOwnerCommitsWritesAndExpiry(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	prefix := fdbtest.NewPrefix(t)
	bin := buildFDBBinary(t)
	a := startReplica(t, bin, "a", cf, prefix)
	waitOwner(t, []*replica{a})
	reps := []*replica{a, startReplica(t, bin, "b", cf, prefix), startReplica(t, bin, "c", cf, prefix)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const ttl = 5 * time.Second

	// Leases are granted at 1,000 a minute over each phase's window: what
	// the test checks is who expires them at that rate, which a longer
	// window only measures longer (-expiry-window 1m for more samples).
	window := *expiryWindow
	perWindow := func(d time.Duration) int { return int(1000 * d.Minutes()) }
	steady := runPhase(ctx, t, "steady", reps, 16, perWindow(window), window, ttl)
	steady.report(t)
	steady.check(t)

	owner := waitOwner(t, reps)
	_ = owner.cmd.Process.Kill()
	var left []*replica
	for _, r := range reps {
		if r != owner {
			left = append(left, r)
		}
	}
	killed := time.Now()
	waitOwner(t, left)
	t.Logf("owner %s killed: a survivor owns writes and expiry after %v", owner.name, time.Since(killed).Round(100*time.Millisecond))
	after := runPhase(ctx, t, "after-failover", left, 16, perWindow(window/2), window/2, ttl)
	after.report(t)
	after.check(t)
}
