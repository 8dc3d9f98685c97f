package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// conflicting makes every read-write transaction conflict while on is set,
// as under contention that never lets up: the storage retries forever.
type conflicting struct {
	storage.DB
	on *atomic.Bool
}

func (d conflicting) Update(ctx context.Context, fn func(storage.Tx) error) error {
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		if err := fn(tx); err != nil || !d.on.Load() {
			return err
		}
		return storage.ErrNotCommitted
	})
}

// TestGrantTimesOutAsEtcd: a group commit of grants that cannot commit ends
// after commitTimeout with etcd's "request timed out", instead of holding
// the grant, and every grant and renewal queued behind it, until the
// storage recovers.
func TestGrantTimesOutAsEtcd(t *testing.T) {
	var on atomic.Bool
	db := conflicting{DB: testdb.Open(t), on: &on}
	store, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	own := owner.Start(db, owner.Config{})
	l := New(store, own, Config{})
	t.Cleanup(func() {
		on.Store(false)
		l.Stop()
		own.Stop()
		store.Close()
	})
	on.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := l.Grant(ctx, 7, 60); !errors.Is(err, mvcc.ErrTimeout) {
		t.Fatalf("grant under endless conflicts: %v, want mvcc.ErrTimeout", err)
	}
	on.Store(false)
	if _, err := l.Grant(ctx, 8, 60); err != nil {
		t.Fatalf("grant after the conflicts: %v", err)
	}
}
