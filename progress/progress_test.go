package progress

import (
	"fmt"
	"testing"
	"time"
)

func TestInterval(t *testing.T) {
	zero := func(int64) int64 { return 0 }
	top := func(n int64) int64 { return n - 1 }
	for _, tc := range []struct {
		base   time.Duration
		jitter func(int64) int64
		want   time.Duration
	}{
		{0, zero, DefaultInterval},
		{time.Millisecond, zero, MinInterval},
		{time.Second, zero, time.Second},
		{time.Second, top, time.Second + 100*time.Millisecond - 1},
	} {
		if got := Interval(tc.base, tc.jitter); got != tc.want {
			t.Errorf("Interval(%v) = %v, want %v", tc.base, got, tc.want)
		}
	}
	for range 100 {
		if d := Interval(time.Second, nil); d < time.Second || d >= 1100*time.Millisecond {
			t.Fatalf("jittered interval %v", d)
		}
	}
}

func TestEligible(t *testing.T) {
	for _, tc := range []struct {
		rev, start, created int64
		want                bool
	}{
		{10, 0, 10, true},
		{10, 5, 10, true},
		{10, 10, 9, true},
		{10, 11, 10, false}, // etcd #20221: no progress below the start
		{9, 0, 10, false},   // never below the created response's revision
	} {
		if got := Eligible(tc.rev, tc.start, tc.created); got != tc.want {
			t.Errorf("Eligible(%d, %d, %d) = %v", tc.rev, tc.start, tc.created, got)
		}
	}
}

func TestRequestsCoalesce(t *testing.T) {
	var r Requests
	if r.Pending() {
		t.Fatal("pending at start")
	}
	r.Add(5)
	r.Add(3)
	if !r.Pending() || r.Target() != 5 {
		t.Fatalf("target %d", r.Target())
	}
	if n := r.Take(); n != 2 || r.Pending() {
		t.Fatalf("took %d", n)
	}
	for i := range 100 {
		r.Add(int64(i))
	}
	if n := r.Take(); n != MaxPending {
		t.Fatalf("a burst owes %d answers, want %d", n, MaxPending)
	}
}

// etcd's sendLoop rule: due at each tick unless events were sent since the
// previous one.
func TestPeriodic(t *testing.T) {
	var p Periodic
	p.Add(3)
	p.Add(1)
	if got := fmt.Sprint(p.Tick()); got != "[1 3]" {
		t.Fatalf("first tick %s", got)
	}
	p.Sent(1)
	p.Sent(99) // unknown: ignored
	if got := fmt.Sprint(p.Tick()); got != "[3]" {
		t.Fatalf("tick after events for 1: %s", got)
	}
	if got := fmt.Sprint(p.Tick()); got != "[1 3]" {
		t.Fatalf("next tick %s", got)
	}
	p.Remove(3)
	if got := fmt.Sprint(p.Tick()); got != "[1]" || p.Len() != 1 {
		t.Fatalf("after remove %s", got)
	}
}
