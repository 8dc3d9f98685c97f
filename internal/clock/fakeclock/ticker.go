package fakeclock

import (
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/progress"
)

// ticker is a progress.Ticker that Advance fires.
type ticker struct {
	c      chan time.Time
	period time.Duration
	next   time.Time // guarded by the clock's mu
}

func (t *ticker) C() <-chan time.Time { return t.c }

// Stop does nothing: a stopped fake ticker's channel is simply no longer
// read.
func (t *ticker) Stop() {}

var _ progress.Clock = (*Clock)(nil)

// NewTicker returns a ticker that fires when Advance passes its period.
func (c *Clock) NewTicker(d time.Duration) progress.Ticker {
	if d <= 0 {
		panic("fakeclock: non-positive ticker period")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &ticker{c: make(chan time.Time, 1), period: d, next: c.now.Add(d)}
	c.tickers = append(c.tickers, t)
	c.notify()
	return t
}

// fireTickers fires every ticker whose period elapsed, dropping ticks a
// slow reader missed, as time.Ticker does. The caller holds mu.
func (c *Clock) fireTickers() {
	for _, t := range c.tickers {
		if t.next.After(c.now) {
			continue
		}
		for !t.next.After(c.now) {
			t.next = t.next.Add(t.period)
		}
		select {
		case t.c <- c.now:
		default:
		}
	}
}

// AwaitTickers waits until n tickers have been created on the clock: the
// code under test has started its ticking loops. It fails the test after a
// real-time minute.
func (c *Clock) AwaitTickers(t testing.TB, n int) {
	t.Helper()
	c.awaitCount(t, n, "tickers", func() int { return len(c.tickers) })
}
