// Package fakeclock is a manual clock.Clock and progress.Clock for tests:
// time moves only when the test advances it, and the test can wait until
// every loop on the clock has reacted and gone back to sleep.
package fakeclock

import (
	"sync"
	"testing"
	"time"
)

// Clock is a manual clock.
type Clock struct {
	mu       sync.Mutex
	now      time.Time
	sleepers map[*sleeper]struct{}
	tickers  []*ticker     // progress tickers (ticker.go)
	changed  chan struct{} // closed and replaced when the sleepers or tickers change
}

type sleeper struct {
	at         time.Time
	fired      chan struct{}
	stop, wake <-chan struct{}
}

// New returns a clock reading start.
func New(start time.Time) *Clock {
	return &Clock{now: start, sleepers: map[*sleeper]struct{}{}, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep blocks until Advance reaches now+d, or stop or wake is closed.
func (c *Clock) Sleep(d time.Duration, stop, wake <-chan struct{}) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	s := &sleeper{at: c.now.Add(d), fired: make(chan struct{}), stop: stop, wake: wake}
	c.sleepers[s] = struct{}{}
	c.notify()
	c.mu.Unlock()
	select {
	case <-s.fired:
	case <-stop:
	case <-wake:
	}
	c.mu.Lock()
	delete(c.sleepers, s)
	c.notify()
	c.mu.Unlock()
}

func (c *Clock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves the clock forward and wakes the sleepers it reaches.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireTickers()
	for s := range c.sleepers {
		if !s.at.After(c.now) {
			select {
			case <-s.fired:
			default:
				close(s.fired)
			}
		}
	}
	c.notify()
}

// asleep counts the sleepers that nothing has woken yet.
func (c *Clock) asleep() int {
	n := 0
	for s := range c.sleepers {
		if !closed(s.fired) && !closed(s.stop) && !closed(s.wake) {
			n++
		}
	}
	return n
}

func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// BlockUntil waits until n loops sleep on the clock with nothing pending to
// wake them: with one sleep per loop, it returns once every loop has
// finished reacting to the last Advance (or to a wake-up one loop gave
// another) and gone back to sleep. It fails the test after a real-time
// minute.
func (c *Clock) BlockUntil(t testing.TB, n int) {
	t.Helper()
	c.awaitCount(t, n, "loops asleep", c.asleep)
}

// awaitCount waits until count, called with mu held, reaches n, checking
// whenever the sleepers or tickers change. It fails the test after a
// real-time minute.
func (c *Clock) awaitCount(t testing.TB, n int, what string, count func() int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		c.mu.Lock()
		have, ch := count(), c.changed
		c.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("fake clock: %d %s after a minute, want %d", have, what, n)
		}
	}
}
