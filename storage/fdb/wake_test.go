//go:build fdb

package fdb_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkOwnCommitToWake measures, per commit, the time from the return
// of an Update that writes a key to the return of the same DB's
// WaitChange on that key (wake-ms): what a write owner's watch hub waits
// before it reads a commit it made itself.
func BenchmarkOwnCommitToWake(b *testing.B) {
	db := fdbtest.Open(b)
	c := ctx(b)
	set(b, db, "k", "0")
	var total time.Duration
	for i := range b.N {
		seen := []byte(strconv.Itoa(i))
		woke := make(chan time.Time, 1)
		go func() {
			if err := db.WaitChange(c, []byte("k"), seen); err != nil {
				b.Error(err)
			}
			woke <- time.Now()
		}()
		time.Sleep(20 * time.Millisecond) // the waiter's watch is set
		set(b, db, "k", strconv.Itoa(i+1))
		committed := time.Now()
		total += (<-woke).Sub(committed)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "wake-ms")
}
