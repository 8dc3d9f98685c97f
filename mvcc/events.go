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

// WaitRev blocks until the current revision exceeds after, and returns it.
// It is woken by the storage's commit notification, never by polling.
func (s *Store) WaitRev(ctx context.Context, after int64) (int64, error) {
	f := storage.Latest
	for {
		raw, rev, err := s.readHead(storage.WithFreshness(ctx, f))
		if err != nil || rev > after {
			return rev, err
		}
		if f == storage.Recent {
			// The recent snapshot predates the change that woke us (a
			// commit through another handle): read the latest before
			// waiting again.
			f = storage.Latest
			continue
		}
		if err := s.db.WaitChange(ctx, keyspace.Head, raw); err != nil {
			return 0, err
		}
		// When a commit of this DB woke us, a recent snapshot has it
		// (storage.Recent never reads below one) and may spare
		// FoundationDB's read version round trip.
		f = storage.Recent
	}
}

// readHead reads the raw head and its revision.
func (s *Store) readHead(ctx context.Context) ([]byte, int64, error) {
	var raw []byte
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		raw, err = tx.Get(keyspace.Head)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	h, err := revision.DecodeHead(raw)
	if err != nil {
		return nil, 0, err
	}
	return raw, h.Rev, nil
}
