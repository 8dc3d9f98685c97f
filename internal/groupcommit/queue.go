// Package groupcommit batches concurrent requests into one commit without a
// goroutine of its own: the caller that finds no batch in progress commits
// one itself (LevelDB's writer queue). Requests that arrive meanwhile queue
// up, and when the batch is done its leader hands the lead to the oldest of
// them, which commits everything queued so far in one batch. A lone caller
// thus commits on its own goroutine, without two goroutine hand-offs per
// request.
//
// A caller that gives up while queued leaves the queue at once, and a
// leader whose batch must wait (the revision sequencer's batch behind
// another writer's staged write) puts it back at the front of the queue,
// where its callers can still give up, while it waits.
//
// The revision sequencer's KV writes and the lessor's grants and renewals
// commit through it.
package groupcommit

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
)

// Limits bound one batch: at most MaxBatch requests, and no request is
// added once the batch holds MaxBytes (a first request larger than that
// still makes a batch of its own). Zero means no bound.
//
// Gather, when positive, lets a batch wait for the requests that are on
// their way back (gather.go): at most Gather, and at most half as long as
// the previous batch took to commit, on Clock (nil: the real clock).
type Limits struct {
	MaxBatch int
	MaxBytes int
	Gather   time.Duration
	Clock    clock.Clock
}

// Waiter is one queued request. The batch's committer answers it exactly
// once, with Answer.
type Waiter[Req, Resp any] struct {
	Ctx  context.Context
	Req  Req
	Size int

	out  chan result[Resp] // the answer; buffered
	lead chan struct{}     // told to lead the next batch; buffered
}

type result[Resp any] struct {
	resp Resp
	err  error
}

// Answer gives the waiter its outcome; it never blocks.
func (w *Waiter[Req, Resp]) Answer(resp Resp, err error) {
	w.out <- result[Resp]{resp: resp, err: err}
}

// Queue is one group-commit queue. Its zero value is not usable: New.
type Queue[Req, Resp any] struct {
	limits     Limits
	errStopped error

	mu      sync.Mutex
	waiting []*Waiter[Req, Resp] // queued, in arrival order, a requeued batch first; guarded by mu
	leading bool                 // a caller is committing a batch; guarded by mu
	stopped bool                 // guarded by mu
	idle    *sync.Cond           // signalled when the lead is given up
	gather  gathering            // guarded by mu
}

// New returns a queue; requests submitted after Stop fail with errStopped.
func New[Req, Resp any](limits Limits, errStopped error) *Queue[Req, Resp] {
	if limits.Clock == nil {
		limits.Clock = clock.Real{}
	}
	q := &Queue[Req, Resp]{limits: limits, errStopped: errStopped}
	q.idle = sync.NewCond(&q.mu)
	return q
}

// Do queues req and waits for its answer. A caller that is given the lead
// commits batches with commit, which must answer every waiter it is handed
// or Requeue it.
// A request whose ctx ends before a batch takes it is answered with ctx's
// error and never committed; once taken, it is decided whatever ctx does,
// which keeps "did it apply?" answerable for the caller.
func (q *Queue[Req, Resp]) Do(ctx context.Context, req Req, size int, commit func([]*Waiter[Req, Resp])) (Resp, error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	// From here the request waits for a batch, or leads one that waits for
	// the store: its scheduler slot, if it holds one, can serve another's
	// evaluation meanwhile.
	fairsched.HandBack(ctx)
	w := &Waiter[Req, Resp]{Ctx: ctx, Req: req, Size: size, out: make(chan result[Resp], 1), lead: make(chan struct{}, 1)}
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return zero, q.errStopped
	}
	q.waiting = append(q.waiting, w)
	q.gather.arrived(len(q.waiting))
	lead := !q.leading
	q.leading = true
	q.mu.Unlock()
	done := ctx.Done()
	for {
		if lead {
			q.lead(commit)
			lead = false // passed on: only a new lead token makes it lead again
		}
		select {
		case r := <-w.out:
			return r.resp, r.err
		case <-w.lead:
			lead = true
		case <-done:
			if q.withdraw(w) {
				return zero, ctx.Err()
			}
			done = nil // taken: its batch decides it
		}
	}
}

// withdraw takes w out of the queue if no batch has taken it yet, passing
// on a lead it was given meanwhile.
func (q *Queue[Req, Resp]) withdraw(w *Waiter[Req, Resp]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.waiting, w)
	if i < 0 {
		return false
	}
	q.waiting = slices.Delete(q.waiting, i, i+1)
	select {
	case <-w.lead:
		q.passLead()
	default:
	}
	return true
}

// lead commits one batch from the front of the queue, then passes the lead
// on.
func (q *Queue[Req, Resp]) lead(commit func([]*Waiter[Req, Resp])) {
	q.mu.Lock()
	q.awaitGathered()
	batch := q.take()
	q.mu.Unlock()
	var began, ended time.Time
	if len(batch) > 0 {
		began = q.limits.Clock.Now()
		commit(batch)
		ended = q.limits.Clock.Now()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(batch) > 0 {
		q.gather.committed(len(batch), began, ended, q.limits.Gather)
	}
	q.passLead()
}

// passLead hands the lead to the oldest request still waiting, or gives it
// up. The caller holds mu.
func (q *Queue[Req, Resp]) passLead() {
	if len(q.waiting) > 0 {
		q.waiting[0].lead <- struct{}{}
		return
	}
	q.leading = false
	q.idle.Broadcast()
}

// take removes the next batch from the queue; the caller holds mu. Requests
// whose context has ended are answered here, uncommitted.
func (q *Queue[Req, Resp]) take() []*Waiter[Req, Resp] {
	var batch []*Waiter[Req, Resp]
	bytes, n := 0, 0
	for n < len(q.waiting) && q.room(len(batch), bytes) {
		w := q.waiting[n]
		n++
		if err := w.Ctx.Err(); err != nil {
			var zero Resp
			w.Answer(zero, err)
			continue
		}
		batch = append(batch, w)
		bytes += w.Size
	}
	clear(q.waiting[:n])
	q.waiting = q.waiting[n:]
	return batch
}

// Requeue puts batch back at the front of the queue, in its order, for a
// leader whose batch must wait for something else before it can commit:
// while the leader waits, holding the lead, the requests of batch can leave
// as queued ones do, and when it passes the lead on, the next batch takes
// them first. Only commit calls it, for waiters it was handed.
func (q *Queue[Req, Resp]) Requeue(batch []*Waiter[Req, Resp]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = append(slices.Clip(batch), q.waiting...)
}

// FailQueued answers err to those requests of a requeued batch that are
// still queued, and takes them out of the queue: the wait the batch was
// requeued for failed, and they must not wait for the next batch.
func (q *Queue[Req, Resp]) FailQueued(batch []*Waiter[Req, Resp], err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = slices.DeleteFunc(q.waiting, func(w *Waiter[Req, Resp]) bool {
		if !slices.Contains(batch, w) {
			return false
		}
		var zero Resp
		w.Answer(zero, err)
		return true
	})
}

func (q *Queue[Req, Resp]) room(n, bytes int) bool {
	if q.limits.MaxBatch > 0 && n >= q.limits.MaxBatch {
		return false
	}
	return n == 0 || q.limits.MaxBytes <= 0 || bytes < q.limits.MaxBytes
}

// Stop fails later requests and waits until the requests already queued
// have been decided.
func (q *Queue[Req, Resp]) Stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	q.gather.wakeLeader()
	for q.leading {
		q.idle.Wait()
	}
}
