package pebble

import (
	"context"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// TestCommitWakesOnlyItsKeys: a WaitChange on one key sleeps through
// commits of other keys (each wake-up was a read, per waiter, per commit,
// of every keyspace sharing the store) and wakes on a commit of its key,
// including a range clear over it.
func TestCommitWakesOnlyItsKeys(t *testing.T) {
	db, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	set := func(k string) {
		if err := db.Update(ctx, func(tx storage.Tx) error { tx.Set([]byte(k), []byte("v")); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for _, wakeBy := range []func(){
		func() { set("a") },
		func() {
			_ = db.Update(ctx, func(tx storage.Tx) error { tx.ClearRange([]byte("a"), []byte("b")); return nil })
		},
	} {
		var seen []byte
		if err := db.View(ctx, func(tx storage.ReadTx) (err error) { seen, err = tx.Get([]byte("a")); return err }); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- db.WaitChange(ctx, []byte("a"), seen) }()
		w := waiterOf(t, db, "a")
		set("b")
		set("a0")
		select {
		case <-w.ch:
			t.Fatal("commits of other keys woke the waiter of a")
		case err := <-done:
			t.Fatalf("WaitChange returned on other keys' commits: %v", err)
		default:
		}
		wakeBy()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// waiterOf waits until a WaitChange waits on key and returns its entry.
func waiterOf(t *testing.T, db *DB, key string) *keyWait {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		db.notifyMu.Lock()
		w := db.waiting[key]
		db.notifyMu.Unlock()
		if w != nil {
			return w
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("nobody waits on %q", key)
	return nil
}
