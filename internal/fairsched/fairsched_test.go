package fairsched_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
)

// queued starts a goroutine acquiring for tenant and returns the channel
// that yields its result once it has a slot or failed; it returns once the
// request is waiting in the scheduler (want waiting in total).
func queued(t *testing.T, s *fairsched.Scheduler, tenant string, cost, waiting int) <-chan result {
	t.Helper()
	ch := make(chan result, 1)
	go func() {
		rel, err := s.Acquire(context.Background(), tenant, cost)
		ch <- result{tenant: tenant, release: rel, err: err}
	}()
	deadline := time.Now().Add(time.Minute)
	for s.Stats().Waiting < waiting {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting after a minute, want %d", s.Stats().Waiting, waiting)
		}
		runtime.Gosched()
	}
	return ch
}

type result struct {
	tenant  string
	release func()
	err     error
}

func get(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", r.tenant, r.err)
		}
		return r
	case <-time.After(time.Minute):
		t.Fatal("no slot after a minute")
		return result{}
	}
}

// pending fails the test if ch's request already has a slot.
func pending(t *testing.T, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s got a slot before its turn", r.tenant)
	default:
	}
}

func acquire(t *testing.T, s *fairsched.Scheduler, tenant string) func() {
	t.Helper()
	rel, err := s.Acquire(context.Background(), tenant, 1)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// A tenant alone takes every slot without waiting, and gets the next one
// as soon as one is given back.
func TestAloneGetsEverySlot(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 4})
	var rels []func()
	for range 4 {
		rels = append(rels, acquire(t, s, "a"))
	}
	if st := s.Stats(); st.Running != 4 || st.Waiting != 0 {
		t.Fatalf("stats %+v, want 4 running and none waiting", st)
	}
	fifth := queued(t, s, "a", 1, 1)
	pending(t, fifth)
	rels[0]()
	get(t, fifth).release()
	for _, rel := range rels[1:] {
		rel()
	}
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v after every release, want zero", st)
	}
}

// A tenant with one request waiting gets the next slot after at most one
// turn of a tenant with many waiting, not after all of them.
func TestRoundRobinAcrossTenants(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1})
	hold := acquire(t, s, "a")
	var as []<-chan result
	for i := range 5 {
		as = append(as, queued(t, s, "a", 1, i+1))
	}
	b := queued(t, s, "b", 1, 6)
	hold()
	first := get(t, as[0])
	pending(t, b)
	first.release()
	get(t, b).release() // b's turn comes before a's second request
	for _, a := range as[1:] {
		get(t, a).release()
	}
}

// Within a tenant, requests run in the order they came.
func TestFIFOWithinTenant(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1})
	hold := acquire(t, s, "a")
	var as []<-chan result
	for i := range 4 {
		as = append(as, queued(t, s, "a", 1, i+1))
	}
	hold()
	for i, a := range as {
		r := get(t, a)
		for _, later := range as[i+1:] {
			pending(t, later)
		}
		r.release()
	}
}

// Work costing three quanta waits for three turns: a tenant of cheap work
// runs twice before it.
func TestDeficitCost(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1})
	hold := acquire(t, s, "x")
	heavy := queued(t, s, "heavy", 3, 1)
	var lights []<-chan result
	for i := range 3 {
		lights = append(lights, queued(t, s, "light", 1, i+2))
	}
	hold()
	// heavy's first turn: a deficit of 1 < 3; light runs; heavy (2) waits
	// again; light runs; heavy (3) runs.
	get(t, lights[0]).release()
	pending(t, heavy)
	get(t, lights[1]).release()
	get(t, heavy).release()
	get(t, lights[2]).release()
}

// The slot bound holds under concurrent use, and every request is served.
func TestSlotsBound(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 3, Queue: 1000, MaxWait: time.Minute})
	var mu sync.Mutex
	running, peak := 0, 0
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := s.Acquire(context.Background(), string(rune('a'+i%4)), 1)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			running++
			peak = max(peak, running)
			mu.Unlock()
			runtime.Gosched()
			mu.Lock()
			running--
			mu.Unlock()
			rel()
		}()
	}
	wg.Wait()
	if peak > 3 {
		t.Fatalf("%d ran at once, slots 3", peak)
	}
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v after every release, want zero", st)
	}
}

// A tenant's queue is bounded: the request past it fails at once with
// etcd's too many requests, and the other tenants still queue.
func TestQueueBound(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1, Queue: 2})
	hold := acquire(t, s, "a")
	a1 := queued(t, s, "a", 1, 1)
	a2 := queued(t, s, "a", 1, 2)
	if _, err := s.Acquire(context.Background(), "a", 1); !errors.Is(err, fairsched.ErrTooManyRequests) {
		t.Fatalf("third waiting request of a: %v, want too many requests", err)
	}
	b := queued(t, s, "b", 1, 3)
	hold()
	get(t, a1).release()
	get(t, b).release()
	get(t, a2).release()
}

// A request that waits MaxWait fails with too many requests and leaves
// nothing behind; one whose context ends fails with its status.
func TestWaitBounds(t *testing.T) {
	clk := fakeclock.New(time.Unix(0, 0))
	s := fairsched.New(fairsched.Config{Slots: 1, MaxWait: time.Second, Clock: clk})
	hold := acquire(t, s, "a")
	late := queued(t, s, "b", 1, 1)
	clk.BlockUntil(t, 1)
	clk.Advance(time.Second)
	if r := <-late; !errors.Is(r.err, fairsched.ErrTooManyRequests) {
		t.Fatalf("after MaxWait: %v, want too many requests", r.err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "c", 1)
		done <- err
	}()
	clk.BlockUntil(t, 1)
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("after cancel: %v, want Canceled", err)
	}
	if st := s.Stats(); st.Waiting != 0 || st.Tenants != 0 || st.Running != 1 {
		t.Fatalf("stats %+v, want only the held slot", st)
	}
	hold()
	acquire(t, s, "d")() // the slot is free again: nothing leaked it
}

// Giving up leaves no goroutine and no tenant state behind.
func TestNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	s := fairsched.New(fairsched.Config{Slots: 2, MaxWait: 10 * time.Millisecond})
	hold := []func(){acquire(t, s, "a"), acquire(t, s, "a")}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond)
			defer cancel()
			if rel, err := s.Acquire(ctx, string(rune('b'+i%3)), 1); err == nil {
				rel()
			}
		}()
	}
	wg.Wait()
	for _, rel := range hold {
		rel()
	}
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v, want zero", st)
	}
	deadline := time.Now().Add(time.Minute)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before", runtime.NumGoroutine(), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
