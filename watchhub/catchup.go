package watchhub

import (
	"errors"
	"math"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// catchUp brings a stream's unsynced watchers to the hub's revision: it
// reads the revision log from the lowest revision any of them needs, up to
// the hub's revision, in bounded batches shared by all of them, queues each
// watcher's events (waiting for room: only this stream waits), and moves
// every watcher that reached the hub's revision back into the index under
// the hub's lock. It runs while the stream has unsynced watchers.
func (h *Hub) catchUp(st *Stream) {
	defer h.wg.Done()
	var ws []*Watcher
	for {
		var rd mvcc.WatchRead
		var done bool
		ws, rd, done = h.behind(st, ws[:0])
		if done {
			return
		}
		if len(ws) > 0 {
			h.catchUpRead(st, ws, rd)
		}
	}
}

// behind appends to ws the stream's unsynced watchers that are still behind
// the hub's revision, with the read that serves them all, and moves the
// others, which dispatch has reached, back into the index. done: nothing is
// left to catch up, or the stream or the hub is ending; the stream stops
// catching up, answering the requests that waited for it.
func (h *Hub) behind(st *Stream, ws []*Watcher) (_ []*Watcher, rd mvcc.WatchRead, done bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st.closed || h.stopping || len(st.unsynced) == 0 {
		st.catchingUp = false
		if st.reqs.Pending() {
			h.answer(st)
		}
		return ws, rd, true
	}
	// From storage: a watcher created at a past revision is refused if a
	// compaction acknowledged before it started passed that revision, which
	// only storage knows for certain (another replica may have compacted).
	rd = mvcc.WatchRead{From: math.MaxInt64, UpTo: h.rev, MaxRevs: h.cfg.CatchUpRevs, MaxBytes: h.cfg.ReadBytes, FromStorage: true}
	for w := range st.unsynced {
		if w.next > rd.UpTo {
			// Caught up: the hub dispatches everything after UpTo.
			delete(st.unsynced, w)
			w.state, w.lagging = stateSynced, false
			h.idx.add(w)
			continue
		}
		ws = append(ws, w)
		rd.From = min(rd.From, w.next)
		rd.PrevKV = rd.PrevKV || w.prevKV
	}
	return ws, rd, false
}

// catchUpRead reads the next batch of history for ws and delivers it. A
// compaction past a watcher's next revision cancels it; a failed read is
// tried again, after a pause, by the next round.
func (h *Hub) catchUpRead(st *Stream, ws []*Watcher, rd mvcc.WatchRead) {
	b, err := h.src.ReadWatchEvents(h.ctx, rd)
	switch {
	case errors.Is(err, mvcc.ErrCompacted):
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, w := range ws {
			if w.state == stateUnsynced && w.next < b.Compacted {
				h.compact(w, b.Compacted)
			}
		}
		return
	case err != nil:
		if h.ctx.Err() == nil {
			h.lg.Warn("watch hub: catch-up read failed; retrying", zap.Error(err))
			h.sleep()
		}
		return
	}
	if !h.deliver(st, ws, b) {
		return // the stream closed or the hub is stopping
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range ws {
		if w.state == stateUnsynced {
			w.next = max(w.next, b.To+1)
		}
	}
}

// deliver queues each watcher's events of batch b, one response per watcher
// with the batch's last revision as header revision (etcd answers a
// unsynced watcher at the current revision). The watchers in ws are
// unsynced: only this goroutine moves their next revision, and a watcher
// canceled meanwhile has its responses dropped by the queue.
func (h *Hub) deliver(st *Stream, ws []*Watcher, b mvcc.EventBatch) bool {
	ix := newIndex(false)
	for _, w := range ws {
		ix.add(w)
	}
	var groups []*group
	for _, re := range revEventsOf(b) {
		for i, ev := range re.full {
			groups = ix.match(ev.PB.Kv.Key, groups[:0])
			for _, g := range groups {
				for _, w := range g.ws {
					if w.next <= re.rev && !w.filtered(ev.PB) {
						w.cuEvents = append(w.cuEvents, re.at(i, w.prevKV))
					}
				}
			}
		}
	}
	ok := true
	for _, w := range ws {
		evs := w.cuEvents
		w.cuEvents = nil
		if len(evs) == 0 || !ok {
			continue
		}
		r := Response{Kind: KindEvents, WatchID: w.id, Rev: b.To, Events: evs, Fragment: w.fragment, size: eventsSize(evs)}
		ok = st.pushEventsWait(h.ctx, w, r)
	}
	return ok
}
