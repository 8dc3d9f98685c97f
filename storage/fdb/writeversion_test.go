//go:build fdb

package fdb_test

import (
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// updateRecent runs fn in an Update whose context says storage.Recent.
func updateRecent(t *testing.T, db storage.DB, fn func(storage.Tx) error) {
	t.Helper()
	if err := db.Update(storage.WithFreshness(ctx(t), storage.Recent), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func setRecent(t *testing.T, db storage.DB, key, value string) {
	t.Helper()
	updateRecent(t, db, func(tx storage.Tx) error {
		tx.Set([]byte(key), []byte(value))
		return nil
	})
}

// TestUpdateReusesWriteVersion: Recent Updates that follow this DB's own
// commit within WriteVersionAge read at its version and ask for no read
// version; once the version aged, or without Recent, they ask again.
func TestUpdateReusesWriteVersion(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_000_000, 0))
	db := openAt(t, fdbtest.NewPrefix(t), clk.Now)
	rec := &recorder{}
	db.SetObserver(rec)
	set(t, db, "k", "0")
	first := rec.snapshot().readVersions
	for range 10 {
		setRecent(t, db, "k", "1")
	}
	if n := rec.snapshot().readVersions - first; n != 0 {
		t.Fatalf("10 Recent Updates right after a commit asked for %d read versions, want 0", n)
	}
	set(t, db, "k", "2")
	if n := rec.snapshot().readVersions - first; n != 1 {
		t.Fatalf("a Latest Update asked for %d read versions, want 1", n)
	}
	clk.Advance(fdb.DefaultWriteVersionAge + time.Millisecond)
	setRecent(t, db, "k", "3")
	if n := rec.snapshot().readVersions - first; n != 2 {
		t.Fatalf("a Recent Update once the version aged asked for %d read versions, want 1 more", n-1)
	}
}

// TestReusedWriteVersionStaysLinearizable: another process commits after
// the version this DB would reuse. A Recent Update that writes is checked
// for conflicts and retried, and so is one that only reads; so each sees
// the other process's write.
func TestReusedWriteVersionStaysLinearizable(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	clk := fakeclock.New(time.Unix(1_000_000, 0))
	db := openAt(t, prefix, clk.Now)
	other := openAt(t, prefix, time.Now)
	readK := func(tx storage.Tx) string {
		v, err := tx.Get([]byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		return string(v)
	}

	set(t, db, "k", "1")
	set(t, other, "k", "2")
	var read string
	updateRecent(t, db, func(tx storage.Tx) error { read = readK(tx); return nil })
	if read != "2" {
		t.Fatalf("a read-only Update read %q after another process wrote 2", read)
	}

	set(t, db, "k", "3")
	set(t, other, "k", "4")
	updateRecent(t, db, func(tx storage.Tx) error {
		tx.Set([]byte("k"), []byte(readK(tx)+"+"))
		return nil
	})
	if v := string(get(t, other, "k")); v != "4+" {
		t.Fatalf("a read-modify-write Update left %q after another process wrote 4, want 4+", v)
	}
}
