package groupcommit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
)

// timedCommitter commits like committer, and each commit takes took on the
// fake clock.
type timedCommitter struct {
	committer
	clk  *fakeclock.Clock
	took time.Duration
}

func (c *timedCommitter) commit(batch []*waiter) {
	c.clk.Advance(c.took)
	c.committer.commit(batch)
}

func (c *timedCommitter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.batches)
}

// gatherQueue returns a queue that gathers for up to max on a fake clock,
// with a first batch of 0, 1 and 2 committed in 10 ms.
func gatherQueue(t *testing.T, max time.Duration) (*groupcommit.Queue[int, int], *timedCommitter) {
	t.Helper()
	clk := fakeclock.New(time.Unix(0, 0))
	q := groupcommit.New[int, int](groupcommit.Limits{Gather: max, Clock: clk}, errStopped)
	c := &timedCommitter{clk: clk, took: 10 * time.Millisecond}
	c.entered, c.gate = make(chan struct{}, 10), make(chan struct{})
	var wg sync.WaitGroup
	for v := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := q.Do(context.Background(), v, 0, c.commit); err != nil {
				t.Error(err)
			}
		}()
		if v == 0 {
			<-c.entered
		} else {
			waitQueued(t, q, v)
		}
	}
	close(c.gate) // [0], then [1 2]
	wg.Wait()
	c.entered = nil
	if got, want := c.String(), "[[0] [1 2]]"; got != want {
		t.Fatalf("first batches %s, want %s", got, want)
	}
	return q, c
}

// TestBatchGathersItsPreviousCallers: the callers of a batch of two come
// back one after the other; the first one back waits for the second, and
// they commit as one batch instead of two.
func TestBatchGathersItsPreviousCallers(t *testing.T) {
	q, c := gatherQueue(t, time.Second)
	done := make(chan error, 2)
	go func() { _, err := q.Do(context.Background(), 3, 0, c.commit); done <- err }()
	c.clk.BlockUntil(t, 1) // the leader waits for the second caller
	go func() { _, err := q.Do(context.Background(), 4, 0, c.commit); done <- err }()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got, want := c.String(), "[[0] [1 2] [3 4]]"; got != want {
		t.Fatalf("batches %s, want %s", got, want)
	}
}

// TestGatherWaitsNoLongerThanItsWindow: a leader waits at most half as
// long as the previous batch took to commit, and only within that long of
// its answers: a caller that arrives later does not wait at all.
func TestGatherWaitsNoLongerThanItsWindow(t *testing.T) {
	q, c := gatherQueue(t, time.Second)
	done := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 3, 0, c.commit); done <- err }()
	c.clk.BlockUntil(t, 1)
	c.clk.Advance(4 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the leader stopped waiting 4 ms into a 5 ms window: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	c.clk.Advance(time.Millisecond)
	if err := within(t, done); err != nil {
		t.Fatal(err)
	}
	// The batch of one took 10 ms too: its window closed as it was
	// answered, 5 ms ago; a batch of one asks for nobody anyway.
	c.clk.Advance(6 * time.Millisecond)
	if _, err := q.Do(context.Background(), 4, 0, c.commit); err != nil {
		t.Fatal(err)
	}
	if got, want := c.String(), "[[0] [1 2] [3] [4]]"; got != want {
		t.Fatalf("batches %s, want %s", got, want)
	}
}

// TestGatherIsBounded: the window is never longer than Gather, however
// long the previous batch took.
func TestGatherIsBounded(t *testing.T) {
	q, c := gatherQueue(t, time.Millisecond)
	done := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 3, 0, c.commit); done <- err }()
	c.clk.BlockUntil(t, 1)
	c.clk.Advance(time.Millisecond)
	if err := within(t, done); err != nil {
		t.Fatal(err)
	}
}

// within returns what done delivers, failing the test if it takes a
// (real) second: the leader sleeps on the fake clock, so only a wait
// longer than the test allows keeps it.
func within(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Second):
		t.Fatal("the leader still waits")
		return nil
	}
}

// TestStopEndsAGather: Stop does not wait out a leader's gathering.
func TestStopEndsAGather(t *testing.T) {
	q, c := gatherQueue(t, time.Second)
	done := make(chan error, 1)
	go func() { _, err := q.Do(context.Background(), 3, 0, c.commit); done <- err }()
	c.clk.BlockUntil(t, 1)
	stopped := make(chan error, 1)
	go func() { q.Stop(); stopped <- nil }()
	if err := within(t, stopped); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
