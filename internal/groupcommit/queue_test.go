package groupcommit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
)

var errStopped = errors.New("stopped")

type waiter = groupcommit.Waiter[int, int]

// committer answers each request with twice its value and records the
// batches it was handed. gate, when set, holds each commit until it is
// told to go on.
type committer struct {
	mu      sync.Mutex
	batches [][]int
	entered chan struct{}
	gate    chan struct{}
}

func (c *committer) commit(batch []*waiter) {
	if c.entered != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	var reqs []int
	for _, w := range batch {
		reqs = append(reqs, w.Req)
		w.Answer(2*w.Req, nil)
	}
	c.mu.Lock()
	c.batches = append(c.batches, reqs)
	c.mu.Unlock()
}

func TestLoneRequestCommitsOnItsCaller(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{}, errStopped)
	c := &committer{}
	got, err := q.Do(context.Background(), 21, 0, c.commit)
	if err != nil || got != 42 || len(c.batches) != 1 {
		t.Fatalf("Do = %d, %v; batches %v", got, err, c.batches)
	}
}

// TestQueuedRequestsShareABatch holds the first commit until the others are
// queued: they go into the next batch together, within the limits.
func TestQueuedRequestsShareABatch(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{MaxBatch: 3}, errStopped)
	c := &committer{entered: make(chan struct{}, 10), gate: make(chan struct{})}
	var wg sync.WaitGroup
	do := func(v int) {
		defer wg.Done()
		if got, err := q.Do(context.Background(), v, 0, c.commit); err != nil || got != 2*v {
			t.Errorf("Do(%d) = %d, %v", v, got, err)
		}
	}
	wg.Add(1)
	go do(0)
	<-c.entered
	for v := 1; v <= 4; v++ {
		wg.Add(1)
		go do(v)
	}
	waitQueued(t, q, 4)
	close(c.gate)
	wg.Wait()
	if len(c.batches) != 3 || len(c.batches[1]) != 3 || len(c.batches[2]) != 1 {
		t.Fatalf("batches %v, want [0] then 3 then 1", c.batches)
	}
}

// TestCanceledWaiterLeaves cancels a queued request while a batch commits:
// it returns at once, uncommitted, and the waiter behind it still commits.
func TestCanceledWaiterLeaves(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{MaxBatch: 1}, errStopped)
	c := &committer{entered: make(chan struct{}, 10), gate: make(chan struct{})}
	first := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 1, 0, c.commit); first <- err }()
	<-c.entered
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() { _, err := q.Do(ctx, 2, 0, c.commit); second <- err }()
	waitQueued(t, q, 1)
	third := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 3, 0, c.commit); third <- err }()
	waitQueued(t, q, 2)
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled request: %v", err)
	}
	close(c.gate)
	for _, ch := range []chan error{first, third} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range c.batches {
		if len(b) == 1 && b[0] == 2 {
			t.Fatalf("withdrawn request committed: %v", c.batches)
		}
	}
}

func TestStopWaitsForQueuedAndRefusesLater(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{}, errStopped)
	c := &committer{entered: make(chan struct{}, 10), gate: make(chan struct{})}
	done := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 1, 0, c.commit); done <- err }()
	<-c.entered
	stopped := make(chan struct{})
	go func() { q.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a batch was committing")
	case <-time.After(50 * time.Millisecond):
	}
	close(c.gate)
	<-stopped
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := q.Do(context.Background(), 2, 0, c.commit); !errors.Is(err, errStopped) {
		t.Fatalf("Do after Stop: %v", err)
	}
}

// waitQueued waits until n requests wait behind the committing one.
func waitQueued(t *testing.T, q *groupcommit.Queue[int, int], n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for q.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", q.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
