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

// gate holds a request named "hold" (held) once it is being applied: it
// reports that, and waits for release, holding the lead while the test
// queues requests behind it.
type gate struct {
	holding, release chan struct{}
}

type held struct {
	key
	g gate
}

func (h held) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (int64, bool, error, error) {
	select {
	case h.g.holding <- struct{}{}:
	default: // a retry: the test knows already
	}
	<-h.g.release
	return h.key.Apply(tx, env, rev, id)
}

// queuedCtx is a request's context that tells when the request is queued:
// a queued request's Do watches its ctx.Done while it waits, and calls
// Done for nothing else before.
type queuedCtx struct {
	context.Context
	once   sync.Once
	queued chan struct{}
}

func newQueuedCtx(parent context.Context) *queuedCtx {
	return &queuedCtx{Context: parent, queued: make(chan struct{})}
}

func (c *queuedCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.queued) })
	return c.Context.Done()
}

// awaitQueued waits until the request of ctx is queued.
func awaitQueued(t *testing.T, ctx *queuedCtx) {
	t.Helper()
	select {
	case <-ctx.queued:
	case <-time.After(30 * time.Second):
		t.Fatal("the request is not queued")
	}
}

// A request whose caller gives up while it is queued behind a batch leaves
// the queue at once, while that batch is still committing, and is never
// applied; the request queued behind it still commits.
func TestCanceledWhileQueuedLeaves(t *testing.T) {
	db := openDB(t)
	g := gate{holding: make(chan struct{}, 1), release: make(chan struct{})}
	seq := revision.New[int64](db, recorder{}, revision.Config{})
	defer seq.Stop()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	defer release() // before Stop, which waits for the held batch
	heldErr := make(chan error, 1)
	go func() { _, err := seq.Do(context.Background(), held{key("hold"), g}, 10); heldErr <- err }()
	<-g.holding
	parent, cancel := context.WithCancel(context.Background())
	ctx := newQueuedCtx(parent)
	canceled := make(chan error, 1)
	go func() { _, err := seq.Do(ctx, key("canceled"), 10); canceled <- err }()
	awaitQueued(t, ctx)
	afterCtx := newQueuedCtx(context.Background())
	after := make(chan int64, 1)
	go func() {
		r, err := seq.Do(afterCtx, key("after"), 10)
		if err != nil {
			t.Error(err)
		}
		after <- r
	}()
	awaitQueued(t, afterCtx)
	cancel()
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled request answered %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a canceled request stays queued while the batch ahead of it commits")
	}
	release()
	if err := <-heldErr; err != nil {
		t.Fatal(err)
	}
	if r := <-after; r != 3 {
		t.Fatalf("the request after the canceled one took revision %v, want 3", r)
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

// Callers that give up at random moments, queued, leading or in a batch,
// all get an answer, the lead is never lost, and the requests that were
// applied took dense revisions.
func TestCancellationsKeepTheQueueMoving(t *testing.T) {
	seq := revision.New[int64](openDB(t), recorder{}, revision.Config{})
	defer seq.Stop()
	const callers, each = 16, 200
	revs := make(chan int64, callers*each)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ctx, cancel := context.WithCancel(context.Background())
				if i%3 == 0 {
					go cancel()
				}
				resp, err := seq.Do(ctx, key(fmt.Sprintf("c/%d/%d", c, i)), 10)
				cancel()
				switch {
				case err == nil:
					revs <- resp
				case !errors.Is(err, context.Canceled):
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(revs)
	seen := map[int64]bool{}
	for r := range revs {
		seen[r] = true
	}
	for r := int64(2); r < 2+int64(len(seen)); r++ {
		if !seen[r] {
			t.Fatalf("revision %d missing among %d answered requests", r, len(seen))
		}
	}
	if r, err := seq.Do(context.Background(), key("last"), 10); err != nil || r != 2+int64(len(seen)) {
		t.Fatalf("after the cancellations: revision %v, %v; want %d", r, err, 2+len(seen))
	}
}
