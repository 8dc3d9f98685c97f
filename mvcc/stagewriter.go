package mvcc

import (
	"context"
	"sync"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// stageWriter writes the pages of a staged request, StageWorkers at a time,
// each in its own transaction. Pages are numbered as they are submitted, in
// key order: a page's sub-revisions and log parts follow the previous
// page's, so the writes do not depend on which transaction commits first.
// It owns its goroutines: wait returns once all have ended.
type stageWriter struct {
	s   *Store
	r   revision.Reservation
	ctx context.Context
	// revoke: the keys' attachments are the lease's, cleared at
	// publication; clearing them here would hide the keys from a second
	// staging of the same revoke.
	revoke bool
	sem    chan struct{}
	wg     sync.WaitGroup

	// Guarded by the submitting goroutine.
	sub   int64 // the next sub-revision
	part  int   // the next log part; part 0 is written at publication
	total int64

	mu  sync.Mutex
	err error // the first failure; guarded by mu
}

func newStageWriter(ctx context.Context, s *Store, r revision.Reservation, revoke bool) *stageWriter {
	return &stageWriter{s: s, r: r, ctx: ctx, revoke: revoke, sem: make(chan struct{}, s.cfg.StageWorkers), part: 1}
}

func (w *stageWriter) abort(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *stageWriter) failed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err != nil
}

// submit numbers page and writes it in the background; it blocks while
// StageWorkers pages are being written.
func (w *stageWriter) submit(page []*entry) {
	events := make([]logEvent, len(page))
	for i, e := range page {
		events[i] = logEvent{Type: evDelete, Sub: w.sub + int64(i), PrevRev: e.meta.ModRev, Key: e.key}
	}
	parts := encodeLogParts(nil, events)
	part0 := w.part
	w.sub += int64(len(page))
	w.part += len(parts)
	w.total += int64(len(page))
	if w.failed() {
		return
	}
	w.sem <- struct{}{}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer func() { <-w.sem }()
		if err := w.write(page, events, parts, part0); err != nil {
			w.abort(err)
		}
	}()
}

// write stages one page: tombstones in the index and history at the
// reserved revision, the attachments of deleted keys cleared, the page's
// log parts. Each index tombstone records the version it deletes, so that
// readers of the reserved base — everyone until publication — need no
// history read per key.
func (w *stageWriter) write(page []*entry, events []logEvent, parts [][]byte, part0 int) error {
	rev := w.r.Base + 1
	ctx, cancel := context.WithTimeout(w.ctx, w.s.cfg.Sequencer.CommitTimeout)
	defer cancel()
	return w.s.db.Update(ctx, func(tx storage.Tx) error {
		if err := w.r.Check(tx); err != nil {
			return err
		}
		for i, e := range page {
			if e.meta.Lease != 0 && !w.revoke {
				tx.Clear(keyspace.Attach(e.meta.Lease, e.key))
			}
			prev := e.meta
			prev.Prev = nil
			tx.Set(keyspace.Latest(e.key), encodeMeta(meta{ModRev: rev, Tombstone: true, Prev: &prev}))
			tx.Set(keyspace.History(e.key, rev), encodeVersion(version{Sub: events[i].Sub, Tombstone: true, Chunks: 1}))
		}
		for i, p := range parts {
			tx.Set(keyspace.Log(rev, part0+i), p)
		}
		return nil
	})
}

// wait returns the number of keys staged, once every page is written.
func (w *stageWriter) wait() (int64, error) {
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.total, w.err
}
