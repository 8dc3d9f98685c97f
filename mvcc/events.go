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
