package watch

import "github.com/fdb-etcd/fdb-etcd/watchhub"

// maxCoalescedEvents bounds the events merged into one response, like
// etcd's watchBatchMaxRevs bounds a lagging watcher's batch.
const maxCoalescedEvents = 1000

// coalesce merges the event responses of one watcher within each run of
// event responses in rs, so that a stream that fell behind sends one response
// per watcher rather than one per watcher per revision — what a lagging etcd
// watcher gets too. Runs end at any other response (created, canceled,
// progress), which therefore keep their order relative to every event: a
// progress notification is never overtaken by events queued after it, nor
// sent before events queued before it. Each watcher's events stay in
// revision order and the merged header is the newest revision.
func coalesce(rs []watchhub.Response) []watchhub.Response {
	if len(rs) < 2 {
		return rs
	}
	out := rs[:0]
	// watch id -> index in out, for the current run; owned marks merged
	// responses whose Events slice is already a private copy. A response's
	// Events are shared with the hub, so the first merge copies them once
	// and later merges append in place (clipping on every merge would copy
	// the whole batch each time: quadratic in a lagging watcher's backlog).
	first := map[int64]int{}
	owned := map[int]bool{}
	for _, r := range rs {
		if r.Kind != watchhub.KindEvents {
			clear(first)
			out = append(out, r)
			continue
		}
		if i, ok := first[r.WatchID]; ok && len(out[i].Events)+len(r.Events) <= maxCoalescedEvents {
			m := &out[i]
			if !owned[i] {
				m.Events = append(make([]*watchhub.Event, 0, 2*(len(m.Events)+len(r.Events))), m.Events...)
				owned[i] = true
			}
			m.Events = append(m.Events, r.Events...)
			m.Rev = max(m.Rev, r.Rev)
			continue
		}
		first[r.WatchID] = len(out)
		out = append(out, r)
	}
	clear(rs[len(out):])
	return out
}
