//go:build fdb

package fdb_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// readVersion is a read version of db's cluster.
func readVersion(t *testing.T, db *fdb.DB) int64 {
	t.Helper()
	var v int64
	if err := db.View(ctx(t), func(tx storage.ReadTx) error {
		v = tx.(storage.Snapshotter).Snapshot()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestViewsOfOneVersionShareATransaction: Views reading at one version
// read on one transaction (sharedread.go); a View at another version does
// not read on it.
func TestViewsOfOneVersionShareATransaction(t *testing.T) {
	db := fdbtest.Open(t)
	set(t, db, "k", "v")
	v := readVersion(t, db)
	share := func(v int64) any {
		var s any
		if err := fdb.ViewFirstAt(db, ctx(t), v, func(tx storage.ReadTx) error {
			s = fdb.ShareOf(tx)
			got, err := tx.Get([]byte("k"))
			if err == nil && string(got) != "v" {
				t.Errorf("k = %q at version %d, want v", got, v)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := share(v)
	if first == nil {
		t.Fatal("a View's first attempt read on a transaction of its own")
	}
	for range 5 {
		if s := share(v); s != first {
			t.Fatal("two Views at one read version read on different transactions")
		}
	}
	set(t, db, "k", "v")
	if s := share(readVersion(t, db)); s == first {
		t.Fatal("a View at a newer read version read on the transaction of an older one")
	}
}

// TestSharedReadLeftWhenItsRequestEnds: a View whose request ends while
// its read of a shared transaction waits returns at once; another View of
// the transaction, still wanted, keeps waiting for its own read and, when
// that fails with a retryable error, reads again on a transaction of its
// own. A read version far ahead of the cluster makes the reads wait
// (FoundationDB answers future_version after a while).
func TestSharedReadLeftWhenItsRequestEnds(t *testing.T) {
	db := fdbtest.Open(t)
	var rec recorder
	db.SetObserver(&rec)
	set(t, db, "k", "v")
	ahead := readVersion(t, db) + 1e12

	// The View that stays: its first attempt waits for its read.
	stayReading, stayFailed := make(chan struct{}), make(chan error, 1)
	stayDone := make(chan error, 1)
	var got []byte
	go func() {
		attempts := 0
		stayDone <- fdb.ViewFirstAt(db, ctx(t), ahead, func(tx storage.ReadTx) error {
			attempts++
			if attempts == 1 {
				close(stayReading)
			}
			v, err := tx.Get([]byte("k"))
			if attempts == 1 {
				stayFailed <- err
			}
			got = v
			return err
		})
	}()
	<-stayReading

	// The View that leaves, on the same transaction: a range read, whose
	// future the binding does not let it cancel.
	leaving, cancel := context.WithCancel(ctx(t))
	var once sync.Once
	leftDone := make(chan error, 1)
	go func() {
		leftDone <- fdb.ViewFirstAt(db, leaving, ahead, func(tx storage.ReadTx) error {
			once.Do(cancel)
			_, err := tx.GetRange([]byte("a"), []byte("z"), storage.RangeOptions{})
			return err
		})
	}()
	select {
	case err := <-leftDone:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the View whose request ended: %v, want context.Canceled", err)
		}
	case err := <-stayFailed:
		t.Fatalf("a View of the shared transaction saw its read end (%v) before the View whose request ended returned: that View waited for its read", err)
	}
	if err := <-stayFailed; err == nil {
		t.Fatalf("a read at version %d, far ahead of the cluster, succeeded", ahead)
	}
	if err := <-stayDone; err != nil || string(got) != "v" {
		t.Fatalf("the View that stayed: %q, %v; want v read again on a transaction of its own", got, err)
	}
	if r := rec.snapshot().retries; len(r) != 1 {
		t.Errorf("retries observed %v, want the one of the View that stayed", r)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close with a left read of a shared transaction: %v", err)
	}
}

// TestSharedTransactionsServeUpdatesAfter: a shared transaction no View
// uses any more goes back to the pool (sharedread.go, txpool.go) without
// its read-your-writes setting or its read version: an Update that gets it
// reads its own write, and what committed after that version.
func TestSharedTransactionsServeUpdatesAfter(t *testing.T) {
	db := fdbtest.Open(t)
	for i := range 20 {
		want := strconv.Itoa(i)
		set(t, db, "k", want)
		// A View at each new version retires the previous one's
		// transaction.
		if got := string(get(t, db, "k")); got != want {
			t.Fatalf("k = %q after writing %s", got, want)
		}
		if err := db.Update(ctx(t), func(tx storage.Tx) error {
			if got, err := tx.Get([]byte("k")); err != nil || string(got) != want {
				return fmt.Errorf("an Update read k = %q, %v after it was written %s", got, err, want)
			}
			tx.Set([]byte("own"), []byte(want))
			if got, err := tx.Get([]byte("own")); err != nil || string(got) != want {
				return fmt.Errorf("an Update read its own write of %s as %q, %v", want, got, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}
