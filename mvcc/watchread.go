package mvcc

import (
	"context"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// EventBatch is what ReadWatchEvents returns: the events of the revisions
// From..To (To included; revisions without a log entry have no element in
// Revs), read in one snapshot together with the head and compacted
// revisions of that snapshot.
type EventBatch struct {
	Revs      []RevisionEvents
	From, To  int64
	Head      int64
	Compacted int64
}

// ReadWatchEvents is ReadEvents for the watch hub: it reads at most maxRevs
// revisions starting at from, but never past upTo (0: no bound), and reports
// the compacted revision read in the same snapshot, so that the caller can
// drop a PrevKv that etcd would not send (the previous version of an event
// at the compaction revision is below it). A from below the compacted
// revision fails with ErrCompacted; a from past the head returns an empty
// batch with To = from-1.
func (s *Store) ReadWatchEvents(ctx context.Context, from int64, maxRevs int, upTo int64) (EventBatch, error) {
	var b EventBatch
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		b = EventBatch{From: from, To: from - 1}
		h, c, err := readState(tx)
		if err != nil {
			return err
		}
		b.Head, b.Compacted = h.Rev, c.Requested
		if from < c.Requested {
			return ErrCompacted
		}
		to := min(h.Rev, from+int64(maxRevs)-1)
		if upTo > 0 {
			to = min(to, upTo)
		}
		if to < from {
			return nil
		}
		parts, err := tx.GetRange(keyspace.LogFrom(from), keyspace.LogFrom(to+1), storage.RangeOptions{})
		if err != nil {
			return err
		}
		b.Revs, err = s.assembleEvents(tx, parts)
		b.To = to
		return err
	})
	return b, err
}
