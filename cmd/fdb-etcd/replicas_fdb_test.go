//go:build fdb

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestMain starts the throwaway fdbserver the replica tests share.
func TestMain(m *testing.M) { os.Exit(fdbtest.Main(m)) }

// replica is one fdb-etcd process on the shared FoundationDB keyspace.
type replica struct {
	name string
	addr string
	cmd  *exec.Cmd
	log  string
	cli  *clientv3.Client
}

func buildFDBBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fdb-etcd")
	cmd := exec.Command("go", "build", "-tags", "fdb", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func startReplica(t *testing.T, bin, name, clusterFile, prefix string, extra ...string) *replica {
	t.Helper()
	addr := freePort(t)
	log := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, "--name", name, "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+addr, "--advertise-client-urls", "http://"+addr,
		"--backend", "fdb", "--fdb-cluster-file", clusterFile, "--fdb-prefix", prefix)
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, addr: addr, cmd: cmd, log: log}
	t.Cleanup(func() {
		if r.cli != nil {
			_ = r.cli.Close()
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(log)
			t.Logf("%s log:\n%s", name, tail(string(out), 20000))
		}
	})
	r.cli = dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.cli.Get(ctx, "health"); err != nil {
		t.Fatalf("%s not serving: %v", name, err)
	}
	return r
}

func dial(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// leaseOwner reports whether r says (in its metrics) that it owns lease expiry.
func (r *replica) leaseOwner(t *testing.T) bool {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), "\nfdb_etcd_lease_expiry_owner 1\n")
}

type ack struct {
	rev     int64
	key     string
	replica int
	at      time.Time
}

// TestThreeReplicas runs three fdb-etcd processes on one FoundationDB
// keyspace, writes through all of them at once, and watches through the third:
// revisions stay dense and unique across replicas, the watch sees every write
// once and in order, and a write acknowledged by one replica is visible to a
// linearizable read on another. Then one replica is killed under load: the
// others and a client that knew all three go on, and lease expiry moves to a
// survivor.
func TestThreeReplicas(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	prefix := fdbtest.NewPrefix(t)
	bin := buildFDBBinary(t)
	a := startReplica(t, bin, "a", cf, prefix)
	// a starts first, so it is the one that takes lease expiry ownership.
	deadline := time.Now().Add(15 * time.Second)
	for !a.leaseOwner(t) {
		if time.Now().After(deadline) {
			t.Fatal("replica a never took lease expiry ownership")
		}
		time.Sleep(100 * time.Millisecond)
	}
	b := startReplica(t, bin, "b", cf, prefix)
	c := startReplica(t, bin, "c", cf, prefix)
	reps := []*replica{a, b, c}
	const loadTime = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Read your writes across replicas: acknowledged on one, visible on the next.
	for i := 0; i < 30; i++ {
		w, r := reps[i%3], reps[(i+1)%3]
		put, err := w.cli.Put(ctx, "ryw", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		get, err := r.cli.Get(ctx, "ryw")
		if err != nil {
			t.Fatal(err)
		}
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != fmt.Sprint(i) || get.Header.Revision < put.Header.Revision {
			t.Fatalf("write %d acknowledged by %s at revision %d; linearizable read on %s = %v at %d",
				i, w.name, put.Header.Revision, r.name, get.Kvs, get.Header.Revision)
		}
	}

	load := func(reps []*replica, perReplica int, d time.Duration) []ack {
		var mu sync.Mutex
		var acks []ack
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		for ri, r := range reps {
			for w := 0; w < perReplica; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; time.Now().Before(stop); n++ {
						key := fmt.Sprintf("load/%s/%d/%d", r.name, w, n)
						resp, err := r.cli.Put(ctx, key, "v")
						if err != nil {
							t.Errorf("put %s: %v", key, err)
							return
						}
						mu.Lock()
						acks = append(acks, ack{rev: resp.Header.Revision, key: key, replica: ri, at: time.Now()})
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		return acks
	}
	// The same load through one replica, for comparison: the three replicas
	// contend on the revision counter, one does not.
	base := load(reps[:1], 12, loadTime)
	t.Logf("1 replica × 12 clients: %d puts in %v (%.0f/s)", len(base), loadTime, float64(len(base))/loadTime.Seconds())

	start, err := c.cli.Get(ctx, "ryw")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := c.cli.Watch(wctx, "load/", clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1))
	// The watch is drained while the load runs, so that each event's arrival
	// time is when the client got it, not when the test got round to it.
	type seen struct {
		key string
		rev int64
		at  time.Time
	}
	events := make(chan seen, 1<<20)
	go func() {
		defer close(events)
		for wr := range wch {
			now := time.Now()
			if err := wr.Err(); err != nil {
				t.Errorf("watch on c: %v", err)
				return
			}
			for _, ev := range wr.Events {
				events <- seen{key: string(ev.Kv.Key), rev: ev.Kv.ModRevision, at: now}
			}
		}
	}()

	acks := load(reps, 4, loadTime)
	if t.Failed() {
		t.FailNow()
	}
	slices.SortFunc(acks, func(x, y ack) int { return int(x.rev - y.rev) })
	perRep := [3]int{}
	for i, k := range acks {
		perRep[k.replica]++
		if i > 0 && k.rev != acks[i-1].rev+1 {
			t.Fatalf("acknowledged revisions not dense: %d (%s) follows %d (%s)", k.rev, k.key, acks[i-1].rev, acks[i-1].key)
		}
	}
	if acks[0].rev != start.Header.Revision+1 {
		t.Fatalf("first load revision %d, want %d", acks[0].rev, start.Header.Revision+1)
	}
	t.Logf("3 replicas × 4 clients: %d puts in %v (%.0f/s; a %d, b %d, c %d)",
		len(acks), loadTime, float64(len(acks))/loadTime.Seconds(), perRep[0], perRep[1], perRep[2])

	// The watch on c sees exactly the acknowledged writes, in revision order.
	var lat []time.Duration
	timeout := time.After(30 * time.Second)
	for next := 0; next < len(acks); next++ {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("watch ended after %d of %d events", next, len(acks))
			}
			want := acks[next]
			if ev.rev != want.rev || ev.key != want.key {
				t.Fatalf("watch event %d = %s at %d, want %s at %d", next, ev.key, ev.rev, want.key, want.rev)
			}
			lat = append(lat, max(0, ev.at.Sub(want.at)))
		case <-timeout:
			t.Fatalf("watch on c delivered %d of %d events", next, len(acks))
		}
	}
	select {
	case ev := <-events:
		t.Fatalf("extra event %s at %d", ev.key, ev.rev)
	case <-time.After(100 * time.Millisecond):
	}
	slices.Sort(lat)
	t.Logf("watch on c: %d events in order; delivery after the writer's ack p50 %v, p99 %v, max %v",
		len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])

	// Lease expiry moves when its owner dies: a lease granted on b, never
	// kept alive, must still expire after a is killed.
	lease, err := b.cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.cli.Put(ctx, "leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	all := dial(t, a.addr, b.addr, c.addr)
	defer all.Close()
	var puts atomic.Int64
	var failures atomic.Int64
	lctx, lcancel := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	for w := 0; w < 4; w++ {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for n := 0; lctx.Err() == nil; n++ {
				pctx, pcancel := context.WithTimeout(lctx, 5*time.Second)
				_, err := all.Put(pctx, fmt.Sprintf("failover/%d/%d", w, n), "v")
				pcancel()
				if err == nil {
					puts.Add(1)
				} else if lctx.Err() == nil {
					failures.Add(1)
				}
			}
		}()
	}
	time.Sleep(time.Second)
	killedAt := time.Now()
	_ = a.cmd.Process.Kill()
	before := puts.Load()
	time.Sleep(3 * time.Second)
	if puts.Load() == before {
		t.Fatal("no write succeeded through the three-endpoint client in 3 s after a was killed")
	}
	for _, r := range []*replica{b, c} {
		if _, err := r.cli.Put(ctx, "after-kill/"+r.name, "v"); err != nil {
			t.Fatalf("%s after a was killed: %v", r.name, err)
		}
	}
	lcancel()
	lwg.Wait()
	t.Logf("failover: %d puts through the three-endpoint client, %d failed (the requests in flight on a)", puts.Load(), failures.Load())

	for {
		get, err := c.cli.Get(ctx, "leased")
		if err != nil {
			t.Fatal(err)
		}
		if len(get.Kvs) == 0 {
			t.Logf("lease granted on b expired %v after its owner a was killed (TTL 5 s, ownership TTL 3 s)", time.Since(killedAt).Round(100*time.Millisecond))
			break
		}
		if time.Since(killedAt) > 30*time.Second {
			t.Fatal("the lease did not expire within 30 s of a (its expiry owner) being killed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !b.leaseOwner(t) && !c.leaseOwner(t) {
		t.Fatal("neither b nor c owns lease expiry")
	}
}
