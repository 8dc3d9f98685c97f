// Package leasetest has a fake clock for driving the lessor in tests.
package leasetest

import (
	"sync"
	"testing"
	"time"
)

// Clock is a manual clock: time moves only by Advance, which fires every
// timer it passes. It implements lease.Clock.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*timer
	changed chan struct{} // closed and replaced when the timers change
}

type timer struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives once the clock has advanced by d.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, &timer{at: c.now.Add(d), ch: ch})
	c.notify()
	return ch
}

func (c *Clock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves the clock forward and fires the timers it reaches.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	clear(c.timers[len(kept):])
	c.timers = kept
	c.notify()
}

// Waiters returns the number of pending timers.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// BlockUntil waits until n timers are pending: with one timer per sleeping
// loop, it returns once every loop has finished reacting to the last
// Advance and gone back to sleep. It fails the test after a real-time minute.
func (c *Clock) BlockUntil(t testing.TB, n int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		c.mu.Lock()
		have, ch := len(c.timers), c.changed
		c.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("fake clock: %d timers pending after a minute, want %d", have, n)
		}
	}
}
