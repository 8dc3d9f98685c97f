package opcount_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/opcount"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
	"github.com/fdb-etcd/fdb-etcd/storage/storagetest"
)

func inner(t testing.TB) storage.DB {
	t.Helper()
	db, err := pebble.Open("db", pebble.Options{FS: vfs.NewMem(), NoSync: true, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatalf("pebble.Open: %v", err)
	}
	return db
}

// The wrapper changes nothing a caller can see.
func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.DB { return opcount.Wrap(inner(t)) })
}

func TestCountsFollowFoundationDBsClient(t *testing.T) {
	db := opcount.Wrap(inner(t))
	defer db.Close()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// A blind write: a read version at commit, and the commit.
	must(db.Update(ctx, func(tx storage.Tx) error {
		tx.Set([]byte("a"), []byte("1"))
		tx.Set([]byte("b"), []byte("22"))
		return nil
	}))
	if got, want := db.Reset(), (opcount.Counts{Attempts: 1, ReadVersions: 1, Commits: 1, KeysWritten: 2, BytesWritten: 5}); got != want {
		t.Fatalf("blind write: %v, want %v", got, want)
	}
	// Reads in sequence are a round trip each; GetMany is one; a key read
	// before is answered from the read cache; a read-only Update commits
	// locally.
	must(db.Update(ctx, func(tx storage.Tx) error {
		if _, err := tx.Get([]byte("a")); err != nil {
			return err
		}
		if _, err := tx.GetMany([][]byte{[]byte("a"), []byte("b"), []byte("c")}); err != nil {
			return err
		}
		_, err := tx.GetRange([]byte("a"), []byte("z"), storage.RangeOptions{})
		return err
	}))
	if got, want := db.Reset(), (opcount.Counts{Attempts: 1, ReadVersions: 1, ReadRounds: 3, Reads: 4, KeysRead: 4, BytesRead: 10}); got != want {
		t.Fatalf("reads: %v, want %v", got, want)
	}
	// A key the attempt wrote or read is not read again; a GetMany of only
	// such keys is no round trip.
	must(db.Update(ctx, func(tx storage.Tx) error {
		tx.Set([]byte("c"), []byte("3"))
		tx.ClearRange([]byte("x"), []byte("y"))
		if _, err := tx.Get([]byte("c")); err != nil {
			return err
		}
		if _, err := tx.GetMany([][]byte{[]byte("c"), []byte("xa")}); err != nil {
			return err
		}
		if _, err := tx.Get([]byte("a")); err != nil {
			return err
		}
		_, err := tx.Get([]byte("a"))
		return err
	}))
	if got, want := db.Reset(), (opcount.Counts{Attempts: 1, ReadVersions: 1, ReadRounds: 1, Reads: 1, Commits: 1, KeysRead: 1, BytesRead: 2, KeysWritten: 2, BytesWritten: 4}); got != want {
		t.Fatalf("cached reads: %v, want %v", got, want)
	}
	// Every attempt counts, the failed ones too.
	tries := 0
	must(db.View(ctx, func(tx storage.ReadTx) error {
		if _, err := tx.Get([]byte("a")); err != nil {
			return err
		}
		if tries++; tries < 3 {
			return storage.ErrNotCommitted
		}
		return nil
	}))
	if got, want := db.Reset(), (opcount.Counts{Attempts: 3, ReadVersions: 3, ReadRounds: 3, Reads: 3, KeysRead: 3, BytesRead: 6}); got != want {
		t.Fatalf("retried view: %v, want %v", got, want)
	}
}
