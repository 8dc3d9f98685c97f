//go:build fdb

package fdb_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

func openAt(t *testing.T, prefix string, now func() time.Time) *fdb.DB {
	t.Helper()
	return openWith(t, fdb.Options{Prefix: prefix, Now: now})
}

// openWith opens o on the test cluster; it is closed when t ends.
func openWith(t *testing.T, o fdb.Options) *fdb.DB {
	t.Helper()
	o.ClusterFile = fdbtest.ClusterFile(t)
	db, err := fdb.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func getFresh(t *testing.T, db storage.DB, f storage.Freshness, key string) string {
	t.Helper()
	var v []byte
	err := db.View(storage.WithFreshness(ctx(t), f), func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get([]byte(key))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

// TestRecentView: a Recent View reuses the newest version its DB has seen
// while that is at most RecentVersionAge old on the DB's clock, so it
// misses another process's newer commit; it always sees its own DB's
// commits; a Latest View, and a Recent one once the version aged, read the
// latest.
func TestRecentView(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	clk := fakeclock.New(time.Unix(1_000_000, 0))
	db := openAt(t, prefix, clk.Now)
	other := openAt(t, prefix, time.Now)
	set(t, db, "k", "1")
	if v := getFresh(t, db, storage.Recent, "k"); v != "1" {
		t.Fatalf("Recent View after this DB's commit read %q, want 1", v)
	}
	set(t, other, "k", "2") // another process's commit
	if v := getFresh(t, db, storage.Recent, "k"); v != "1" {
		t.Fatalf("Recent View within the age read %q, want the reused snapshot's 1", v)
	}
	if v := getFresh(t, db, storage.Latest, "k"); v != "2" {
		t.Fatalf("Latest View read %q, want 2", v)
	}
	set(t, other, "k", "3")
	// The Latest View's read version is the newest this DB saw: a Recent
	// View never reads older than that.
	if v := getFresh(t, db, storage.Recent, "k"); v != "2" {
		t.Fatalf("Recent View after a Latest one read %q, want 2", v)
	}
	clk.Advance(fdb.DefaultRecentVersionAge + time.Millisecond)
	if v := getFresh(t, db, storage.Recent, "k"); v != "3" {
		t.Fatalf("Recent View once the version aged read %q, want 3", v)
	}
}

// TestSharedReadVersionsLinearizable: concurrent writers each read their
// own key right after writing it, through Latest Views of one DB that share
// read versions, and always see their write: a shared read version is
// requested only after every View that uses it began.
func TestSharedReadVersionsLinearizable(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	db := fdbtest.OpenPrefix(t, prefix)
	writer := fdbtest.OpenPrefix(t, prefix) // another process's commits
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprint("w", w))
			for i := range 50 {
				want := fmt.Sprint(i)
				if err := writer.Update(context.Background(), func(tx storage.Tx) error {
					tx.Set(key, []byte(want))
					return nil
				}); err != nil {
					errs <- err
					return
				}
				var got []byte
				if err := db.View(context.Background(), func(tx storage.ReadTx) error {
					var err error
					got, err = tx.Get(key)
					return err
				}); err != nil {
					errs <- err
					return
				}
				if string(got) != want {
					errs <- fmt.Errorf("writer %d read %q after writing %q", w, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
