package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
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
// queued: they go into the next batch together, within MaxBatch.
func TestQueuedRequestsShareABatch(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{MaxBatch: 3}, errStopped)
	if got, want := batchesBehindHeld(t, q, []int{0, 0, 0, 0, 0}), "[[0] [1 2 3] [4]]"; got != want {
		t.Fatalf("batches %s, want %s", got, want)
	}
}

// batchesBehindHeld commits requests 0, 1, ... of the given sizes: request
// 0's batch is held until the others are queued, in order. It returns the
// batches committed.
func batchesBehindHeld(t *testing.T, q *groupcommit.Queue[int, int], sizes []int) string {
	t.Helper()
	c := &committer{entered: make(chan struct{}, len(sizes)), gate: make(chan struct{})}
	var wg sync.WaitGroup
	do := func(v int) {
		defer wg.Done()
		if got, err := q.Do(context.Background(), v, sizes[v], c.commit); err != nil || got != 2*v {
			t.Errorf("Do(%d) = %d, %v", v, got, err)
		}
	}
	wg.Add(1)
	go do(0)
	<-c.entered
	for v := 1; v < len(sizes); v++ {
		wg.Add(1)
		go do(v)
		waitQueued(t, q, v)
	}
	close(c.gate)
	wg.Wait()
	return fmt.Sprint(c.batches)
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

// TestBatchBytesBound: a batch takes requests until it holds MaxBytes; a
// first request larger than that still makes a batch of its own.
func TestBatchBytesBound(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{MaxBytes: 100}, errStopped)
	if got, want := batchesBehindHeld(t, q, []int{1, 150, 60, 60, 60}), "[[0] [1] [2 3] [4]]"; got != want {
		t.Fatalf("batches %s, want %s", got, want)
	}
}

// requeuer is a committer one of whose batches goes back to the queue: it
// tells the test it has the batch (taken) and waits for proceed, requeues
// the batch, tells the test (requeued) and waits, holding the lead, until
// the test lets it return (resume), with failWith answered to what is
// still queued if set. The other batches commit.
type requeuer struct {
	committer
	q                *groupcommit.Queue[int, int]
	taken, requeued  chan struct{}
	proceed, resume  chan struct{}
	failWith         error
	calls, requeueAt int // requeueAt is the call that requeues, from 1
}

func (r *requeuer) commit(batch []*waiter) {
	r.calls++
	if r.calls != r.requeueAt {
		r.committer.commit(batch)
		return
	}
	r.taken <- struct{}{}
	<-r.proceed
	r.q.Requeue(batch)
	r.requeued <- struct{}{}
	<-r.resume
	if r.failWith != nil {
		r.q.FailQueued(batch, r.failWith)
	}
}

func newRequeuer(q *groupcommit.Queue[int, int], at int) *requeuer {
	return &requeuer{q: q, taken: make(chan struct{}, 1), requeued: make(chan struct{}),
		proceed: make(chan struct{}), resume: make(chan struct{}), requeueAt: at}
}

// TestRequeuedBatchGoesFirst: a requeued batch is taken by the next batch
// before the requests that were queued behind it, and a request of it whose caller
// gives up while it waits leaves at once, uncommitted.
func TestRequeuedBatchGoesFirst(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{}, errStopped)
	r := newRequeuer(q, 2)
	hold := make(chan struct{})
	r.entered, r.gate = make(chan struct{}, 10), hold
	results := map[int]chan error{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	do := func(ctx context.Context, v int) {
		res := make(chan error, 1)
		results[v] = res
		go func() {
			got, err := q.Do(ctx, v, 0, r.commit)
			if err == nil && got != 2*v {
				err = fmt.Errorf("Do(%d) = %d", v, got)
			}
			res <- err
		}()
	}
	do(context.Background(), 0) // leads; its batch is held
	<-r.entered
	do(context.Background(), 1)
	waitQueued(t, q, 1)
	do(ctx, 2)
	waitQueued(t, q, 2)
	close(hold) // [0] commits; [1 2] is taken
	<-r.taken
	do(context.Background(), 3)
	waitQueued(t, q, 1)
	close(r.proceed) // [1 2] goes back, ahead of 3
	<-r.requeued
	waitQueued(t, q, 3)
	cancel()
	if err := <-results[2]; !errors.Is(err, context.Canceled) {
		t.Fatalf("request 2, canceled while requeued: %v", err)
	}
	close(r.resume)
	for _, v := range []int{0, 1, 3} {
		if err := <-results[v]; err != nil {
			t.Fatal(err)
		}
	}
	if want := "[[0] [1 3]]"; fmt.Sprint(r.batches) != want {
		t.Fatalf("batches %v, want %s", r.batches, want)
	}
}

// TestFailQueuedAnswersTheRequeued: when the wait a batch was requeued for
// fails, its requests still queued get the error and are never committed;
// requests queued after it commit in the next batch.
func TestFailQueuedAnswersTheRequeued(t *testing.T) {
	q := groupcommit.New[int, int](groupcommit.Limits{}, errStopped)
	r := newRequeuer(q, 1)
	r.failWith = errors.New("the wait failed")
	close(r.proceed)
	first := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 1, 0, r.commit); first <- err }()
	<-r.requeued
	later := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 2, 0, r.commit); later <- err }()
	waitQueued(t, q, 2)
	close(r.resume)
	if err := <-first; !errors.Is(err, r.failWith) {
		t.Fatalf("requeued request: %v, want %v", err, r.failWith)
	}
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	if want := "[[2]]"; fmt.Sprint(r.batches) != want {
		t.Fatalf("batches %v, want %s", r.batches, want)
	}
}

// TestWaitHandsBackTheSlot: a request that holds a scheduler slot gives it
// back once it is queued, so another request gets the slot while the
// first one's batch commits.
func TestWaitHandsBackTheSlot(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1, MaxWait: 10 * time.Second})
	rel, err := s.Acquire(context.Background(), "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, release := fairsched.Hold(context.Background(), rel)
	q := groupcommit.New[int, int](groupcommit.Limits{}, errStopped)
	c := &committer{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		defer release()
		_, err := q.Do(ctx, 1, 0, c.commit)
		done <- err
	}()
	<-c.entered
	other, err := s.Acquire(context.Background(), "b", 1)
	if err != nil {
		t.Fatalf("another request while the first one's batch commits: %v", err)
	}
	close(c.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	other()
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v after every release, want zero", st)
	}
}
