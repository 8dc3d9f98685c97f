package tenant

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/opcount"
	"github.com/fdb-etcd/fdb-etcd/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newTenantDB creates a tenant in a fresh shared store and returns its
// keyspace and the shared store.
func newTenantDB(t *testing.T, name string) (*DB, storage.DB, *Registry) {
	inner := testdb.Open(t)
	reg := NewRegistry(inner)
	rec, err := reg.Create(ctxT(t), name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return NewDB(inner, rec.ID), inner, reg
}

// TestConformance runs the storage contract's suite on a tenant's keyspace:
// prefixing must not change anything a layer above can see.
func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.DB {
		db, _, _ := newTenantDB(t, "conformance")
		return db
	})
}

// TestKeyspacesDisjoint writes the same keys, the smallest and the largest,
// in two tenants and the root keyspace, and reads each back alone.
func TestKeyspacesDisjoint(t *testing.T) {
	ctx := ctxT(t)
	a, inner, reg := newTenantDB(t, "a")
	rb, err := reg.Create(ctx, "b", 0)
	if err != nil {
		t.Fatal(err)
	}
	b := NewDB(inner, rb.ID)
	for i, db := range []storage.DB{a, b} {
		err := db.Update(ctx, func(tx storage.Tx) error {
			tx.Set([]byte{0x00}, []byte{byte(i)})
			tx.Set([]byte{0xfe, 0xff}, []byte{byte(i)})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, db := range []storage.DB{a, b} {
		var kvs []storage.KeyValue
		err := db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			kvs, err = tx.GetRange([]byte{0x00}, []byte{0xff}, storage.RangeOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(kvs) != 2 || kvs[0].Value[0] != byte(i) || kvs[1].Value[0] != byte(i) || string(kvs[1].Key) != "\xfe\xff" {
			t.Fatalf("tenant %d reads %q", i, kvs)
		}
		size, err := db.(*DB).Size()
		if err != nil || size != 5 {
			t.Fatalf("tenant %d size %d %v, want 5 (its own keys and values)", i, size, err)
		}
	}
	err = a.Update(ctx, func(tx storage.Tx) error { tx.ClearRange([]byte{0x00}, []byte{0xff}); return nil })
	if err != nil {
		t.Fatal(err)
	}
	err = b.View(ctx, func(tx storage.ReadTx) error {
		v, err := tx.Get([]byte{0x00})
		if v == nil && err == nil {
			return errors.New("tenant a's clear reached tenant b")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDeleteFencesTransactions: once a tenant is deleted, its transactions
// fail with ErrDeleted, also a writer that began before the delete and
// retries after it, and nothing is written under the old prefix.
func TestDeleteFencesTransactions(t *testing.T) {
	ctx := ctxT(t)
	db, inner, reg := newTenantDB(t, "doomed")
	put := func(tx storage.Tx) error { tx.Set([]byte("k"), []byte("v")); return nil }
	if err := db.Update(ctx, put); err != nil {
		t.Fatal(err)
	}
	if testdb.Backend() == "fdb" {
		racingWriter(t, db, reg) // Pebble serializes Updates: no writer can straddle the delete
	} else if err := reg.Delete(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(ctx, put); !errors.Is(err, ErrDeleted) {
		t.Fatalf("write after delete: %v, want ErrDeleted", err)
	}
	blind := func(tx storage.Tx) error { tx.Set([]byte("blind"), nil); return nil }
	if err := db.Update(ctx, blind); !errors.Is(err, ErrDeleted) {
		t.Fatalf("blind write after delete: %v, want ErrDeleted", err)
	}
	err := inner.View(ctx, func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(db.prefix, db.end, storage.RangeOptions{})
		if err == nil && len(kvs) > 0 {
			t.Fatalf("deleted tenant left %d keys", len(kvs))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Get(ctx, "doomed"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
}

// racingWriter runs a write whose first attempt reads the tenant, then
// deletes the tenant before that attempt commits: the attempt conflicts,
// and its retry must fail rather than write into the cleared prefix.
func racingWriter(t *testing.T, db *DB, reg *Registry) {
	ctx := ctxT(t)
	attempts := 0
	err := db.Update(ctx, func(tx storage.Tx) error {
		attempts++
		if _, err := tx.Get([]byte("k")); err != nil {
			return err
		}
		if attempts == 1 {
			if err := reg.Delete(ctx, "doomed"); err != nil {
				t.Fatal(err)
			}
		}
		tx.Set([]byte("k2"), []byte("v"))
		return nil
	})
	if !errors.Is(err, ErrDeleted) {
		t.Fatalf("writer racing the delete: %v after %d attempts, want ErrDeleted", err, attempts)
	}
}

// TestKeySizeLimit: a tenant's callers get storage.MaxKeySize, no more,
// although the backend takes the prefixed key.
func TestKeySizeLimit(t *testing.T) {
	db, _, _ := newTenantDB(t, "limits")
	long := make([]byte, storage.MaxKeySize+1)
	err := db.Update(ctxT(t), func(tx storage.Tx) error { tx.Set(long, []byte("v")); return nil })
	if !errors.Is(err, storage.ErrKeyTooLarge) {
		t.Fatalf("set of a %d-byte key: %v, want ErrKeyTooLarge", len(long), err)
	}
	err = db.Update(ctxT(t), func(tx storage.Tx) error { tx.Set(long[1:], []byte("v")); return nil })
	if err != nil {
		t.Fatalf("set of a %d-byte key: %v", len(long)-1, err)
	}
}

// TestReadBatchIsOneRoundTrip: a tenant's batched reads — points, ranges
// and the fence with them — reach the backend as one batch, one round trip
// on FoundationDB as without tenancy, and come back unprefixed.
func TestReadBatchIsOneRoundTrip(t *testing.T) {
	ctx := ctxT(t)
	inner := opcount.Wrap(testdb.Open(t))
	reg := NewRegistry(inner)
	rec, err := reg.Create(ctx, "batched", 0)
	if err != nil {
		t.Fatal(err)
	}
	db := NewDB(inner, rec.ID)
	err = db.Update(ctx, func(tx storage.Tx) error {
		for _, k := range []string{"a", "r/1", "r/2", "s"} {
			tx.Set([]byte(k), []byte("v"+k))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	inner.Reset()
	err = db.View(ctx, func(tx storage.ReadTx) error {
		vals, rows, err := storage.ReadBatch(tx, [][]byte{[]byte("a"), []byte("b")},
			[]storage.RangeRead{{Begin: []byte("r/"), End: []byte("r0")}, {Begin: []byte("s"), End: []byte("t")}})
		if err != nil {
			return err
		}
		if string(vals[0]) != "va" || vals[1] != nil || len(vals) != 2 {
			t.Errorf("points %q, want [va <nil>]", vals)
		}
		var keys []string
		for _, kvs := range rows {
			for _, kv := range kvs {
				keys = append(keys, string(kv.Key)+"="+string(kv.Value))
			}
		}
		if got := strings.Join(keys, " "); got != "r/1=vr/1 r/2=vr/2 s=vs" {
			t.Errorf("ranges %s, want r/1=vr/1 r/2=vr/2 s=vs", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := inner.Reset(); c.ReadRounds != 1 {
		t.Fatalf("a tenant's ReadBatch took %d read round trips, want 1 (%v)", c.ReadRounds, c)
	}
	if err := reg.Delete(ctx, "batched"); err != nil {
		t.Fatal(err)
	}
	err = db.View(ctx, func(tx storage.ReadTx) error {
		_, _, err := storage.ReadBatch(tx, nil, []storage.RangeRead{{Begin: []byte("r/"), End: []byte("r0")}})
		return err
	})
	if !errors.Is(err, ErrDeleted) {
		t.Fatalf("ReadBatch of a deleted tenant: %v, want ErrDeleted", err)
	}
}

// TestViewsNameTheirSnapshot: a tenant's View names the backend's snapshot,
// so that its store shares the reads of one snapshot among its Views.
func TestViewsNameTheirSnapshot(t *testing.T) {
	ctx := ctxT(t)
	db, inner, _ := newTenantDB(t, "snap")
	var backend int64
	if err := inner.View(ctx, func(tx storage.ReadTx) error { backend = storage.SnapshotOf(tx); return nil }); err != nil {
		t.Fatal(err)
	}
	if backend == 0 {
		t.Skip("the backend's Views name no snapshot")
	}
	err := db.View(ctx, func(tx storage.ReadTx) error {
		if storage.SnapshotOf(tx) == 0 {
			t.Error("a tenant's View names no snapshot where the backend's do")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(ctx, func(tx storage.Tx) error {
		if s := storage.SnapshotOf(tx); s != 0 {
			t.Errorf("a tenant's Update names snapshot %d: its reads must be its own", s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
