// Package rawfdb holds the parts of the benchmark's plain FoundationDB client
// (cmd/fdb-raw) that need no FoundationDB: group commit batching and the
// reuse of a recent read version. The client itself needs cgo and libfdb_c
// and is built only with the build tag fdb.
package rawfdb

import (
	"sync"
	"sync/atomic"
)

// Sized is a request that knows how many bytes it writes.
type Sized interface {
	Size() int
}

// Batcher groups concurrent requests into one commit, the way fdb-etcd's
// group commit (revision.Sequencer) does: a request that finds no commit in
// flight commits at once, on its own goroutine; requests that arrive while a
// commit is in flight queue up, and when that commit ends its leader hands
// the lead to the oldest of them, which commits everything queued so far (up
// to the bounds) in the next transaction. The Batcher has no goroutine.
type Batcher[R Sized] struct {
	commit   func(batch []R) error
	maxBatch int
	maxBytes int

	mu      sync.Mutex
	waiting []*pending[R] // guarded by mu; queued, in arrival order
	leading bool          // guarded by mu; a caller is committing a batch

	batches  atomic.Int64
	requests atomic.Int64
}

type pending[R Sized] struct {
	req  R
	out  chan error    // the batch's outcome; buffered
	lead chan struct{} // told to lead the next batch; buffered
}

// NewBatcher returns a Batcher whose batches hold at most maxBatch requests
// and, unless a single request is larger, maxBytes bytes; commit commits one
// batch and is called by one caller at a time.
func NewBatcher[R Sized](maxBatch, maxBytes int, commit func(batch []R) error) *Batcher[R] {
	return &Batcher[R]{commit: commit, maxBatch: max(maxBatch, 1), maxBytes: maxBytes}
}

// Do submits req and returns the outcome of the commit that carried it.
func (b *Batcher[R]) Do(req R) error {
	p := &pending[R]{req: req, out: make(chan error, 1), lead: make(chan struct{}, 1)}
	b.mu.Lock()
	b.waiting = append(b.waiting, p)
	lead := !b.leading
	b.leading = true
	b.mu.Unlock()
	for {
		if lead {
			b.lead()
		}
		select {
		case err := <-p.out:
			return err
		case <-p.lead:
			lead = true
		}
	}
}

// lead commits one batch from the front of the queue, then passes the lead
// to the oldest request still waiting, or gives it up.
func (b *Batcher[R]) lead() {
	b.mu.Lock()
	batch := b.take()
	b.mu.Unlock()
	reqs := make([]R, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	err := b.commit(reqs)
	b.batches.Add(1)
	b.requests.Add(int64(len(reqs)))
	for _, p := range batch {
		p.out <- err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiting) > 0 {
		b.waiting[0].lead <- struct{}{}
		return
	}
	b.leading = false
}

// take removes the next batch from the queue; the caller holds mu. The
// leader's own request is at the front, so a batch is never empty.
func (b *Batcher[R]) take() []*pending[R] {
	n, bytes := 0, 0
	for n < len(b.waiting) && n < b.maxBatch {
		size := b.waiting[n].req.Size()
		if n > 0 && bytes+size > b.maxBytes {
			break
		}
		bytes += size
		n++
	}
	batch := make([]*pending[R], n)
	copy(batch, b.waiting)
	clear(b.waiting[:n])
	b.waiting = b.waiting[n:]
	return batch
}

// Stats returns how many batches were committed and how many requests they
// carried.
func (b *Batcher[R]) Stats() (batches, requests int64) {
	return b.batches.Load(), b.requests.Load()
}
