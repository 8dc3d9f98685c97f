package mvcc

import (
	"context"
	"sync"

	"github.com/fdb-etcd/fdb-etcd/revision"
)

// The Views that read one snapshot read its state (the head and the
// compaction record) once. On FoundationDB concurrent Views share read
// versions (storage/fdb), so the Ranges of a busy process mostly read the
// same few snapshots, and each read the head again: one of the two read
// requests a single-key GET at the head costs, and those requests, handled
// by the client's one network thread and a storage server, bound how many
// Ranges a process serves (docs/performance.md). The first View of a
// snapshot reads the state with its own reads and publishes it; the others
// send only their own reads, then take what it read. A snapshot's state
// never changes, so taking it from another View is exactly reading it.
//
// Only the newest snapshot is shared: read versions grow, and the Views of
// an older one read their own. A transaction that does not name its
// snapshot (Pebble's, whose reads are in memory; every Update's, whose
// reads are what its commit is checked against) reads its own.

// stateShare is the state of the newest snapshot read through a Store.
type stateShare struct {
	mu   sync.Mutex
	snap int64        // guarded by mu: the snapshot cur is of, 0 before the first
	cur  *sharedState // guarded by mu
}

// sharedState is a snapshot's state, read by its first View.
type sharedState struct {
	done chan struct{} // closed once head, comp and err are set
	head revision.Head
	comp compaction
	err  error // the first View's read failed: the others read their own
}

// join returns the shared state of snapshot snap and the caller's part in
// reading it: stateLead (it reads the state and must publish it),
// stateFollow, or stateOwn (nil state) when snap is 0, s is nil, a newer
// snapshot is shared already, or snap is new and the caller cannot lead:
// the others wait for the leader's whole round trip, so only a View whose
// own reads are small leads.
func (s *stateShare) join(snap int64, canLead bool) (*sharedState, stateRole) {
	if s == nil || snap == 0 {
		return nil, stateOwn
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case snap == s.snap:
		return s.cur, stateFollow
	case snap < s.snap, !canLead:
		return nil, stateOwn
	}
	s.snap, s.cur = snap, &sharedState{done: make(chan struct{})}
	return s.cur, stateLead
}

// publish hands the state its first View read to the others.
func (st *sharedState) publish(head revision.Head, comp compaction, err error) {
	st.head, st.comp, st.err = head, comp, err
	close(st.done)
}

// wait returns the published state. The first View reads at the same
// snapshot as the caller, so it answers about when the caller's own read
// of the state would have; a failed read (its transaction cancelled with
// its request, say) says so, and the caller reads its own. The caller's
// own request may end first: it then stops waiting with its context's
// error, as its own read would have.
func (st *sharedState) wait(ctx context.Context) (revision.Head, compaction, bool, error) {
	select {
	case <-st.done:
		return st.head, st.comp, st.err == nil, nil
	case <-ctx.Done():
		return revision.Head{}, compaction{}, false, ctx.Err()
	}
}
