package watch

import (
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/watchhub"
)

// sentEvents is what the sender has sent each watcher, for the checks of
// race-enabled builds: the newest event revision per watch id.
type sentEvents map[int64]int64

// check verifies, in race-enabled builds, what the sender is about to send
// after coalescing: each watcher's events strictly increase in revision
// from one response to the next, and no (revision, key) repeats within one.
// The hub checks its queue the same way (watchhub's checkEvents); this
// covers what happens to the responses after it.
func (s sentEvents) check(r *watchhub.Response) {
	if !invariants {
		return
	}
	switch r.Kind {
	case watchhub.KindCreated, watchhub.KindCanceled, watchhub.KindCompacted:
		delete(s, r.WatchID)
		return
	case watchhub.KindEvents:
	default:
		return
	}
	prev, seen := s[r.WatchID], map[string]bool{}
	for i, e := range r.Events {
		rev, key := e.Rev(), string(e.PB.Kv.Key)
		switch {
		case i == 0 && rev <= prev, rev < prev:
			panic(fmt.Sprintf("watch: watcher %d: sending event revision %d after %d", r.WatchID, rev, prev))
		case rev != prev:
			clear(seen)
		case seen[key]:
			panic(fmt.Sprintf("watch: watcher %d: sending the event for key %q at revision %d twice", r.WatchID, key, rev))
		}
		seen[key] = true
		prev = rev
	}
	s[r.WatchID] = prev
}
