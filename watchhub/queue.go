package watchhub

import (
	"context"
	"fmt"
	"sync"
)

// queue is a stream's FIFO of responses. Event responses are bounded in
// number and bytes: the hub's non-blocking push fails on a full queue (the
// watcher then catches up), the catch-up goroutine waits for room. Control
// responses (created, canceled, compacted, progress) are always accepted —
// they are small and bounded elsewhere: the receiver waits in WaitControl
// before each request, progress answers coalesce, and a watcher is
// compacted at most once.
type queue struct {
	qmu     sync.Mutex
	q       []Response
	head    int
	events  int
	bytes   int
	control int
	qclosed bool

	maxEvents, maxBytes, maxControl int

	ready    chan struct{} // something was queued
	evSpace  chan struct{} // room for events was freed
	ctlSpace chan struct{} // room for control responses was freed
	done     chan struct{} // closed by closeQueue
}

func newQueue(cfg Config) queue {
	return queue{
		maxEvents: cfg.StreamEntries, maxBytes: cfg.StreamBytes, maxControl: cfg.StreamControl,
		ready:   make(chan struct{}, 1),
		evSpace: make(chan struct{}, 1), ctlSpace: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Ready is signaled whenever a response is queued.
func (q *queue) Ready() <-chan struct{} { return q.ready }

// Done is closed when the stream is closed.
func (q *queue) Done() <-chan struct{} { return q.done }

func (q *queue) append(r Response) {
	q.q = append(q.q, r)
	signal(q.ready)
}

// pushEvents queues an events response for w. It reports false only when the
// queue is full; a response for a canceled watcher or a closed stream is
// dropped and reports true.
func (q *queue) pushEvents(w *Watcher, r Response) bool {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	if q.qclosed || w.gone {
		return true
	}
	if q.events >= q.maxEvents || (q.events > 0 && q.bytes+r.size > q.maxBytes) {
		return false
	}
	checkEvents(w, r)
	q.events++
	q.bytes += r.size
	q.append(r)
	return true
}

// pushEventsWait queues an events response for w, waiting for room. It
// reports false when the stream closed or ctx ended first.
func (q *queue) pushEventsWait(ctx context.Context, w *Watcher, r Response) bool {
	for {
		if q.pushEvents(w, r) {
			q.qmu.Lock()
			closed := q.qclosed
			q.qmu.Unlock()
			return !closed
		}
		select {
		case <-q.evSpace:
		case <-q.done:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (q *queue) pushControl(r Response) {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.pushControlLocked(r)
}

func (q *queue) pushControlLocked(r Response) {
	if q.qclosed {
		return
	}
	q.control++
	q.append(r)
}

// WaitControl returns once the stream has room for the control responses of
// one more request, so that a client that sends requests without reading
// responses is held back by gRPC flow control.
func (q *queue) WaitControl(ctx context.Context) error {
	for {
		q.qmu.Lock()
		ok := q.control < q.maxControl || q.qclosed
		q.qmu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-q.ctlSpace:
		case <-q.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Pop appends up to max queued responses to buf, oldest first.
func (q *queue) Pop(buf []Response, max int) []Response {
	q.qmu.Lock()
	freedEv, freedCtl := false, false
	for n := 0; n < max && q.head < len(q.q); n++ {
		r := q.q[q.head]
		q.q[q.head] = Response{}
		q.head++
		if r.Kind == KindEvents {
			q.events--
			q.bytes -= r.size
			freedEv = true
		} else {
			q.control--
			freedCtl = true
		}
		buf = append(buf, r)
	}
	switch {
	case q.head == len(q.q):
		q.q, q.head = q.q[:0], 0
	case q.head > 64 && q.head > len(q.q)/2:
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q, q.head = q.q[:n], 0
	}
	q.qmu.Unlock()
	if freedEv {
		signal(q.evSpace)
	}
	if freedCtl {
		signal(q.ctlSpace)
	}
	return buf
}

// Len is the number of queued responses and their event bytes.
func (q *queue) Len() (responses, eventBytes int) {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	return len(q.q) - q.head, q.bytes
}

func (q *queue) closeQueue() {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	if q.qclosed {
		return
	}
	q.qclosed = true
	clear(q.q)
	q.q, q.head, q.events, q.bytes, q.control = nil, 0, 0, 0, 0
	close(q.done)
}

// checkEvents verifies, in race-enabled builds, that a watcher's events
// arrive in strictly increasing revision order across responses, never
// above the response's header revision, and never twice: within one
// revision (a transaction's or a range delete's events share it) no key
// appears twice. The caller holds qmu.
func checkEvents(w *Watcher, r Response) {
	if !invariants {
		return
	}
	prev := w.lastRev
	var keys map[string]bool // the keys of revision prev in this response
	for i, ev := range r.Events {
		rev := ev.Rev()
		switch {
		case rev > r.Rev:
			panic(fmt.Sprintf("watchhub: watcher %d: event revision %d above header revision %d", w.id, rev, r.Rev))
		case i == 0 && rev <= prev:
			panic(fmt.Sprintf("watchhub: watcher %d: event revision %d after %d", w.id, rev, prev))
		case rev < prev:
			panic(fmt.Sprintf("watchhub: watcher %d: event revision %d after %d in one response", w.id, rev, prev))
		case w.startRev > 0 && rev < w.startRev:
			panic(fmt.Sprintf("watchhub: watcher %d: event revision %d below start revision %d", w.id, rev, w.startRev))
		case !w.holds(ev.PB.Kv.Key):
			panic(fmt.Sprintf("watchhub: watcher %d: event for key %q outside its range", w.id, ev.PB.Kv.Key))
		}
		if rev != prev || keys == nil {
			keys = map[string]bool{}
		}
		if keys[string(ev.PB.Kv.Key)] {
			panic(fmt.Sprintf("watchhub: watcher %d: event for key %q at revision %d twice in one response", w.id, ev.PB.Kv.Key, rev))
		}
		keys[string(ev.PB.Kv.Key)] = true
		prev = rev
	}
	w.lastRev = prev
}
