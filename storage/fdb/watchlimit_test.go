//go:build fdb

package fdb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// waitEach starts a WaitChange on each of n keys of db (prefix+"00000"...),
// none of which exists, and returns their results' channel once they had
// settle to set up their watches (or fail).
func waitEach(ctx context.Context, db storage.DB, prefix string, n int, settle time.Duration) <-chan error {
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- db.WaitChange(ctx, fmt.Appendf(nil, "%s%05d", prefix, i), nil) }()
	}
	time.Sleep(settle)
	return errs
}

// setAll writes the n keys "w/00000"... that waitEach waits on, from another handle (another
// process's commit: no waiter of db is woken by its own commit).
func setAll(t *testing.T, ctx context.Context, db storage.DB, n int) {
	t.Helper()
	for lo := 0; lo < n; lo += 1000 {
		if err := db.Update(ctx, func(tx storage.Tx) error {
			for i := lo; i < min(lo+1000, n); i++ {
				tx.Set(fmt.Appendf(nil, "w/%05d", i), []byte("x"))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// collect waits for n results and fails t for every error among them.
func collect(t *testing.T, errs <-chan error, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	failed := 0
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				if failed == 0 {
					t.Errorf("WaitChange: %v", err)
				}
				failed++
			}
		case <-deadline:
			t.Fatalf("waits still pending after %v", within)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d waits failed", failed, n)
	}
}

// TestWaitersBeyondDefaultWatchLimit: FoundationDB's client allows 10,000
// outstanding watches per database handle by default and fails the next
// with too_many_watches (1032). A replica serving thousands of tenants
// (one handle for all of them) waits on more keys than that; each wait
// must see its key change, through a watch: polling (an hour apart here)
// would not see it in time.
func TestWaitersBeyondDefaultWatchLimit(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	db := openWith(t, fdb.Options{Prefix: prefix, WatchPollInterval: time.Hour})
	writer := fdbtest.OpenPrefix(t, prefix)
	const n = 10_050
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := waitEach(ctx, db, "w/", n, 3*time.Second)
	select {
	case err := <-errs:
		t.Fatalf("a wait returned before its key changed: %v", err)
	default:
	}
	setAll(t, ctx, writer, n)
	collect(t, errs, n, time.Minute)
}

// TestWaitPollsPastWatchLimit: a wait that FoundationDB refuses a watch
// polls its key instead of failing, and sees its change within a poll
// interval; each poll is observed as a retry of too_many_watches; it ends
// with its context as any wait does.
func TestWaitPollsPastWatchLimit(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	db := openWith(t, fdb.Options{Prefix: prefix, WatchPollInterval: 50 * time.Millisecond})
	var rec recorder
	db.SetObserver(&rec)
	writer := fdbtest.OpenPrefix(t, prefix)
	if err := fdb.SetMaxWatches(db, 4); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fdb.SetMaxWatches(db, fdb.MaxWatches); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 20
	errs := waitEach(ctx, db, "w/", n, time.Second)
	select {
	case err := <-errs:
		t.Fatalf("a wait returned before its key changed: %v", err)
	default:
	}
	setAll(t, ctx, writer, n)
	collect(t, errs, n, 10*time.Second)
	if polls := rec.snapshot().retries[1032]; polls < n-4 {
		t.Errorf("%d polls observed as retries with code 1032; want one at least for each of the %d waits past the limit", polls, n-4)
	}

	// A polling wait still ends with its context: with the four watches
	// held by waits on absent keys, a fifth wait polls until its context
	// ends.
	hold, release := context.WithCancel(ctx)
	held := waitEach(hold, db, "held/", 4, time.Second)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- db.WaitChange(short, []byte("absent"), nil) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitChange past its context: %v, want %v", err, context.DeadlineExceeded)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a wait outlived its context")
	}
	release()
	for range 4 {
		if err := <-held; !errors.Is(err, context.Canceled) {
			t.Errorf("held wait: %v, want %v", err, context.Canceled)
		}
	}
}
