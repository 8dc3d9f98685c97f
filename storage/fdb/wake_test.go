//go:build fdb

package fdb_test

import (
	"sync/atomic"
	"testing"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestOwnCommitWakesOnceSettled: an attempt whose commit is reported
// unknown (1021) wakes no waiter, even though it did commit; the retry
// that finds its marker (and writes nothing) settles it and wakes the
// waiters of the keys the unknown attempt wrote before Update returns.
// A commit that did not write a key wakes none of its waiters.
func TestOwnCommitWakesOnceSettled(t *testing.T) {
	db := fdbtest.Open(t)
	woken, drop := fdb.RegisterWaiter(db, []byte("k"))
	defer drop()
	other, dropOther := fdb.RegisterWaiter(db, []byte("l"))
	defer dropOther()
	ranged, dropRanged := fdb.RegisterWaiter(db, []byte("r/5"))
	defer dropRanged()
	var hooks atomic.Int64
	fdb.SetCommitHook(db, func() error {
		if hooks.Add(1) == 1 {
			return fdbgo.Error{Code: 1021}
		}
		return nil
	})
	attempts := 0
	err := db.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		if woken() || ranged() {
			t.Errorf("attempt %d: a waiter was woken before the unknown commit was settled", attempts)
		}
		marker, err := tx.Get([]byte("marker"))
		if err != nil || marker != nil {
			return err
		}
		tx.Set([]byte("k"), []byte("v"))
		tx.ClearRange([]byte("r/"), []byte("r0"))
		tx.Set([]byte("marker"), []byte{})
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if attempts != 2 {
		t.Fatalf("fn ran %d times, want 2 (1021, then the marker)", attempts)
	}
	if !woken() || !ranged() {
		t.Errorf("Update returned; waiter of k woken: %v, of r/5 (cleared): %v; want both", woken(), ranged())
	}
	if other() {
		t.Errorf("a commit that did not write l woke its waiter")
	}
}
