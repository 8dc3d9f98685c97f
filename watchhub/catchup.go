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
		h.mu.Lock()
		if st.closed || h.stopping || len(st.unsynced) == 0 {
			st.catchingUp = false
			if st.reqs.Pending() {
				h.answer(st)
			}
			h.mu.Unlock()
			return
		}
		upTo := h.rev
		from := int64(math.MaxInt64)
		prevKV := false
		ws = ws[:0]
		for w := range st.unsynced {
			if w.next > upTo {
				// Caught up: the hub dispatches everything after upTo.
				delete(st.unsynced, w)
				w.state, w.lagging = stateSynced, false
				h.idx.add(w)
				continue
			}
			ws = append(ws, w)
			from = min(from, w.next)
			prevKV = prevKV || w.prevKV
		}
		h.mu.Unlock()
		if len(ws) == 0 {
			continue
		}

		b, err := h.src.ReadWatchEvents(h.ctx, mvcc.WatchRead{From: from, UpTo: upTo, MaxRevs: h.cfg.CatchUpRevs, MaxBytes: h.cfg.ReadBytes, PrevKV: prevKV})
		if errors.Is(err, mvcc.ErrCompacted) {
			h.mu.Lock()
			for _, w := range ws {
				if w.state == stateUnsynced && w.next < b.Compacted {
					h.compact(w, b.Compacted)
				}
			}
			h.mu.Unlock()
			continue
		}
		if err != nil {
			if h.ctx.Err() == nil {
				h.lg.Warn("watch hub: catch-up read failed; retrying", zap.Error(err))
				h.sleep()
			}
			continue
		}
		if !h.deliver(st, ws, b) {
			continue // the stream closed or the hub is stopping
		}
		h.mu.Lock()
		for _, w := range ws {
			if w.state == stateUnsynced {
				w.next = max(w.next, b.To+1)
			}
		}
		h.mu.Unlock()
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
