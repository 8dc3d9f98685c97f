// Package progress holds etcd's rules for watch progress notifications, the
// responses with no events that tell a client how far its watch stream has
// got (kube-apiserver's watch cache relies on them for consistent reads):
//
//   - On request (WatchProgressRequest): one header-only response with watch
//     id -1 per stream, whose header revision R promises that every event
//     <= R of every watcher on the stream has been sent before it. etcd sends
//     it only when every watcher of the stream is synced
//     (watchable_store.go, progressIfSync); Requests keeps the requests a
//     stream could not answer yet, so that a transient state (a watcher
//     catching up, the hub behind the store) delays the answer instead of
//     losing it.
//   - Periodic (progress_notify): every interval (plus up to 10% jitter, at
//     least 100 ms; etcd's --experimental-watch-progress-notify-interval) a
//     response with the watcher's own id, skipped for a watcher that was sent
//     events since the previous tick (v3rpc/watch.go, sendLoop). Periodic
//     keeps that bookkeeping.
//   - Eligible is the per-watcher part of the synced rule: no progress below a
//     watcher's start revision (etcd #20221).
//
// Time is injected through Clock so tests can drive the ticks.
package progress

import (
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// InvalidWatchID is the watch id of a progress response that answers a
// WatchProgressRequest on behalf of every watcher of a stream
// (clientv3.InvalidWatchID).
const InvalidWatchID = -1

// DefaultInterval is etcd's default --experimental-watch-progress-notify-interval.
const DefaultInterval = 10 * time.Minute

// MinInterval is the shortest interval etcd accepts; shorter ones are raised
// to it.
const MinInterval = 100 * time.Millisecond

// Interval returns the period of one stream's progress ticker: base (raised
// to MinInterval, DefaultInterval when zero) plus a jitter in [0, base/10)
// so that watchers created together do not all get notified at once.
// jitter(n) must return a value in [0, n); nil uses math/rand.
func Interval(base time.Duration, jitter func(n int64) int64) time.Duration {
	if base <= 0 {
		base = DefaultInterval
	}
	base = max(base, MinInterval)
	if jitter == nil {
		jitter = rand.Int64N
	}
	n := int64(base) / 10
	if n <= 0 {
		return base
	}
	return base + time.Duration(jitter(n))
}

// Eligible reports whether a watcher may be told that it has seen every
// event up to rev: rev must not be below its start revision (startRev 0
// means "from the revision it was created at") nor below createdRev, the
// header revision of its created response.
func Eligible(rev, startRev, createdRev int64) bool {
	return rev >= startRev && rev >= createdRev
}

// Requests are the progress requests a stream has not answered yet. They
// coalesce: each answer promises "everything up to R", so the answer to the
// newest request answers the older ones too, and at most MaxPending answers
// are sent for a burst of requests.
type Requests struct {
	n      int
	target int64
}

// MaxPending bounds the answers owed to a burst of requests.
const MaxPending = 16

// Add records a request made when the store was at revision rev; its
// answer must carry a revision >= rev.
func (r *Requests) Add(rev int64) {
	r.n = min(r.n+1, MaxPending)
	r.target = max(r.target, rev)
}

// Pending reports whether requests wait for an answer.
func (r *Requests) Pending() bool { return r.n > 0 }

// Target is the lowest revision the answer may carry.
func (r *Requests) Target() int64 { return r.target }

// Take returns how many answers to send and forgets the requests.
func (r *Requests) Take() int {
	n := r.n
	*r = Requests{}
	return n
}

// Periodic is one stream's periodic-progress bookkeeping, with etcd's rule:
// at every tick, each progress_notify watcher that was not sent events since
// the previous tick is due a notification.
type Periodic struct {
	due map[int64]bool
}

// Add registers a progress_notify watcher; it is due at the next tick.
func (p *Periodic) Add(id int64) {
	if p.due == nil {
		p.due = make(map[int64]bool)
	}
	p.due[id] = true
}

// Remove forgets a canceled watcher.
func (p *Periodic) Remove(id int64) { delete(p.due, id) }

// Sent records that events were sent to id, which skips its next notification.
func (p *Periodic) Sent(id int64) {
	if _, ok := p.due[id]; ok {
		p.due[id] = false
	}
}

// Len is the number of progress_notify watchers.
func (p *Periodic) Len() int { return len(p.due) }

// Tick returns the watchers due a notification, in id order, and re-arms
// every watcher for the next tick.
func (p *Periodic) Tick() []int64 {
	var ids []int64
	for id, due := range p.due {
		if due {
			ids = append(ids, id)
		}
		p.due[id] = true
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Clock makes tickers; RealClock uses the time package.
type Clock interface {
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of *time.Ticker the watch service uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// RealClock returns a Clock on the time package.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Served is the highest revision a process has put in a response header.
// A progress answer at or above it tells no client of this process anything
// older than what it was already told, so a hub that has dispatched it may
// answer from memory (see watchhub). The zero value is ready; a nil *Served
// observes nothing and loads 0.
type Served struct {
	rev atomic.Int64

	mu     sync.Mutex
	raised chan struct{} // guarded by mu: closed by the next rise; nil until Raised
}

// Observe raises the watermark to rev.
func (s *Served) Observe(rev int64) {
	if s == nil {
		return
	}
	for {
		cur := s.rev.Load()
		if rev <= cur {
			return
		}
		if s.rev.CompareAndSwap(cur, rev) {
			s.signal()
			return
		}
	}
}

func (s *Served) signal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.raised != nil {
		close(s.raised)
		s.raised = nil
	}
}

// Raised returns a channel closed once the watermark rises after the call
// (or a little earlier: callers compare Load with what they wait for). A
// nil *Served's never closes.
func (s *Served) Raised() <-chan struct{} {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.raised == nil {
		s.raised = make(chan struct{})
	}
	return s.raised
}

// Load returns the watermark.
func (s *Served) Load() int64 {
	if s == nil {
		return 0
	}
	return s.rev.Load()
}
