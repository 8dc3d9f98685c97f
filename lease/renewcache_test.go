package lease

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// recordReads counts the lease records read through its Views.
type recordReads struct {
	storage.DB
	n atomic.Int64
}

func (d *recordReads) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return d.DB.View(ctx, func(tx storage.ReadTx) error { return fn(recordReadTx{tx, &d.n}) })
}

// recordReadTx hides the Batcher capability, so that every read goes
// through Get or GetMany and is counted.
type recordReadTx struct {
	storage.ReadTx
	n *atomic.Int64
}

func (tx recordReadTx) count(keys ...[]byte) {
	begin, end := keyspace.LeaseAll()
	for _, k := range keys {
		if bytes.Compare(k, begin) >= 0 && bytes.Compare(k, end) < 0 {
			tx.n.Add(1)
		}
	}
}

func (tx recordReadTx) Get(key []byte) ([]byte, error) {
	tx.count(key)
	return tx.ReadTx.Get(key)
}

func (tx recordReadTx) GetMany(keys [][]byte) ([][]byte, error) {
	tx.count(keys...)
	return tx.ReadTx.GetMany(keys)
}

func renew(t *testing.T, n *node, id, ttl int64) {
	t.Helper()
	if got, _, err := n.l.Renew(ctx(t), id); err != nil || got != ttl {
		t.Fatalf("renew %d: ttl %d, %v; want %d", id, got, err, ttl)
	}
}

// TestKeepAliveReadsItsRecordOnce: a lease kept alive again and again
// while its stored deadline covers it has its record read once; the later
// keep-alives read only the head and the removal mark.
func TestKeepAliveReadsItsRecordOnce(t *testing.T) {
	db := &recordReads{DB: testdb.Open(t)}
	w := newWorld(t, db)
	n := w.add(Config{})
	n.grant(t, 1, 10)
	db.n.Store(0)
	for range 5 {
		renew(t, n, 1, 10)
	}
	if got := db.n.Load(); got != 1 {
		t.Fatalf("5 covered keep-alives read the lease record %d times, want 1", got)
	}
	// Once the stored deadline no longer covers now+TTL, the keep-alive
	// renews it in storage, and the next one reads the record again.
	w.advance(2 * time.Second)
	renew(t, n, 1, 10)
	renew(t, n, 1, 10)
	renew(t, n, 1, 10)
	if got := db.n.Load(); got != 3 {
		t.Fatalf("after the deadline moved, the lease record was read %d times in all, want 3", got)
	}
}

// TestCachedKeepAliveSeesRevokeElsewhere: a keep-alive at a process that
// kept the lease alive before answers ErrLeaseNotFound once a revoke at
// another process completed, like one that reads the record; the other
// leases it kept alive are read again and renewed.
func TestCachedKeepAliveSeesRevokeElsewhere(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	b := w.add(Config{})
	a.grant(t, 1, 10)
	a.grant(t, 2, 10)
	a.put(t, "k", 1)
	for range 2 {
		renew(t, a, 1, 10)
		renew(t, a, 2, 10)
	}
	// One revoke with a key (a revision), then one without.
	for _, id := range []int64{1, 2} {
		if _, err := b.l.Revoke(ctx(t), id); err != nil {
			t.Fatal(err)
		}
		if _, _, err := a.l.Renew(ctx(t), id); !errors.Is(err, ErrLeaseNotFound) {
			t.Fatalf("keep-alive of lease %d revoked at another process: %v, want %v", id, err, ErrLeaseNotFound)
		}
	}
	a.grant(t, 3, 10)
	renew(t, a, 3, 10)
	renew(t, a, 3, 10)
}

// TestCachedKeepAliveSeesImports: a lease the mirrored etcd no longer has
// is not kept alive from what was read before, and one imported again
// with an earlier deadline has the keep-alive write its deadline.
func TestCachedKeepAliveSeesImports(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{})
	n.grant(t, 1, 10)
	n.grant(t, 2, 10)
	renew(t, n, 1, 10)
	renew(t, n, 2, 10)
	update := func(fn func(tx storage.Tx) error) {
		t.Helper()
		if err := w.db.Update(ctx(t), fn); err != nil {
			t.Fatal(err)
		}
	}
	update(func(tx storage.Tx) error { return WriteImported(tx, 2, 10, w.now.Add(time.Second)) })
	renew(t, n, 2, 10)
	if rec, _ := storedRecord(t, w.db, 2); rec.Deadline < w.now.Add(10*time.Second).UnixMicro() {
		t.Fatalf("keep-alive after an import moved the deadline to %v left it there, want at least now+TTL %v",
			time.UnixMicro(rec.Deadline), w.now.Add(10*time.Second))
	}
	renew(t, n, 1, 10) // read again: the import changed the mark
	update(func(tx storage.Tx) error { RemoveImported(tx, 1); return nil })
	if _, _, err := n.l.Renew(ctx(t), 1); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("keep-alive of a lease removed by the mirror: %v, want %v", err, ErrLeaseNotFound)
	}
}

// TestRenewCacheIsBounded: past RenewCache records the lessor keeps no
// more, and the leases it could not keep are still renewed.
func TestRenewCacheIsBounded(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{RenewCache: 2})
	for id := int64(1); id <= 5; id++ {
		n.grant(t, id, 10)
		renew(t, n, id, 10)
		renew(t, n, id, 10)
	}
	n.l.renewed.mu.Lock()
	defer n.l.renewed.mu.Unlock()
	if got := len(n.l.renewed.records); got != 2 {
		t.Fatalf("the cache holds %d records, want its bound 2", got)
	}
}
