package revision_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// recorder is a store whose requests (keys) write themselves with the
// revision they take, log the revision, and answer with it.
type recorder struct{}

func (recorder) Begin(storage.ReadTx) (revision.Env, error) { return revision.Env{}, nil }

type key string

func (k key) Apply(tx storage.Tx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	tx.Set([]byte(k), fmt.Appendf(nil, "%d", rev+1))
	tx.Set(keyspace.Log(rev+1, 0), []byte(k))
	return rev + 1, true, nil, nil
}

func (key) Replay(_ storage.ReadTx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	return rev + 1, true, nil, nil
}

func openDB(t *testing.T) storage.DB {
	t.Helper()
	db, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Concurrent callers take the lead in turn; every request gets its own
// revision, the revisions are dense, and batches form under contention.
func TestConcurrentRequestsGetDenseRevisions(t *testing.T) {
	var batches, maxBatch atomic.Int64
	seq := revision.New[int64](openDB(t), recorder{}, revision.Config{Observe: func(n, _ int, _ time.Duration) {
		batches.Add(1)
		for m := maxBatch.Load(); int64(n) > m && !maxBatch.CompareAndSwap(m, int64(n)); m = maxBatch.Load() {
		}
	}})
	defer seq.Stop()
	const callers, each = 32, 50
	revs := make(chan int64, callers*each)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				resp, err := seq.Do(context.Background(), key(fmt.Sprintf("k/%d/%d", c, i)), 10)
				if err != nil {
					t.Error(err)
					return
				}
				revs <- resp
			}
		}()
	}
	wg.Wait()
	close(revs)
	seen := map[int64]bool{}
	for r := range revs {
		if seen[r] {
			t.Fatalf("revision %d given twice", r)
		}
		seen[r] = true
	}
	for r := int64(2); r < 2+callers*each; r++ {
		if !seen[r] {
			t.Fatalf("revision %d missing: revisions are not dense", r)
		}
	}
	if maxBatch.Load() < 2 {
		t.Errorf("no batch held more than one request in %d batches", batches.Load())
	}
}

// A request whose context ended before it was queued is not applied.
func TestEndedContextIsNotApplied(t *testing.T) {
	db := openDB(t)
	seq := revision.New[int64](db, recorder{}, revision.Config{})
	defer seq.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := seq.Do(ctx, key("canceled"), 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		v, err := tx.Get([]byte("canceled"))
		if err == nil && v != nil {
			return fmt.Errorf("canceled request was applied at %s", v)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Stop lets every queued request finish; requests after it are refused.
func TestStopDecidesQueuedRequests(t *testing.T) {
	seq := revision.New[int64](openDB(t), recorder{}, revision.Config{})
	var wg sync.WaitGroup
	var answered, refused atomic.Int64
	for c := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				_, err := seq.Do(context.Background(), key(fmt.Sprintf("s/%d/%d", c, i)), 10)
				switch {
				case err == nil:
					answered.Add(1)
				case errors.Is(err, revision.ErrStopped):
					refused.Add(1)
					return
				default:
					t.Error(err)
					return
				}
			}
		}()
	}
	for answered.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	seq.Stop()
	wg.Wait() // every caller got an answer: none was left waiting
	if refused.Load() != 16 {
		t.Fatalf("%d callers refused after Stop, want 16", refused.Load())
	}
	if _, err := seq.Do(context.Background(), key("late"), 10); !errors.Is(err, revision.ErrStopped) {
		t.Fatalf("Do after Stop: %v, want ErrStopped", err)
	}
}
