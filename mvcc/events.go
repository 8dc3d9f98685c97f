package mvcc

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// RevisionEvents is everything one revision changed, in etcd's event order.
// Events carry PrevKv whenever the key existed before; watchers that did not
// ask for it drop it.
type RevisionEvents struct {
	Rev    int64
	Events []*mvccpb.Event
}

// ReadEvents returns the events, with PrevKv, of the revisions from..from+maxRevs-1
// up to the head, and the head revision: ReadWatchEvents read to the end of
// that range, for callers that want it whole. A from below the compacted
// revision fails with ErrCompacted.
func (s *Store) ReadEvents(ctx context.Context, from int64, maxRevs int) ([]RevisionEvents, int64, error) {
	var out []RevisionEvents
	upTo := from + int64(maxRevs) - 1
	for {
		b, err := s.ReadWatchEvents(ctx, WatchRead{From: from, UpTo: upTo, PrevKV: true})
		if err != nil {
			return nil, b.Head, err
		}
		out = append(out, b.Revs...)
		if b.To >= min(upTo, b.Head) {
			return out, b.Head, nil
		}
		from = b.To + 1
	}
}

// WaitRev blocks until the current revision exceeds after, and returns it.
// It is woken by the storage's commit notification, never by polling.
func (s *Store) WaitRev(ctx context.Context, after int64) (int64, error) {
	for {
		var raw []byte
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			raw, err = tx.Get(keyspace.Head)
			return err
		})
		if err != nil {
			return 0, err
		}
		h, err := revision.DecodeHead(raw)
		if err != nil {
			return 0, err
		}
		if h.Rev > after {
			return h.Rev, nil
		}
		if err := s.db.WaitChange(ctx, keyspace.Head, raw); err != nil {
			return 0, err
		}
	}
}
