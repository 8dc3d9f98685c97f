package revision_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// sized writes a request's number of bytes, in values under the storage's
// value limit, and logs its revision. A request of 0 bytes waits for gate
// first.
type sized struct {
	n    int
	gate chan struct{}
}

func (sized) Begin(storage.ReadTx) (revision.Env, error) { return revision.Env{}, nil }

func (a sized) Apply(tx storage.Tx, _ *revision.Env, rev int64, id revision.RequestID) (int64, bool, error, error) {
	n := a.n
	if n == 0 {
		<-a.gate
	}
	for i := 0; n > 0; i++ {
		v := make([]byte, min(n, 90_000))
		n -= len(v)
		tx.Set(fmt.Appendf(nil, "v/%d/%d/%d", id.Seq, id.Index, i), v)
	}
	tx.Set(keyspace.Log(rev+1, 0), []byte("x"))
	return rev + 1, true, nil, nil
}

func (sized) Replay(_ storage.ReadTx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	return rev + 1, true, nil, nil
}

// TestBatchTooLargeIsSplit: a batch whose transaction the storage refuses
// as too large (2101) is split until its parts commit, and a request too
// large on its own fails alone with ErrTooLarge while the others commit.
func TestBatchTooLargeIsSplit(t *testing.T) {
	db := faulty.Wrap(openDB(t), faulty.Options{})
	gate := make(chan struct{})
	var mu sync.Mutex
	var batches []int
	seq := revision.New[int64](db, sized{gate: gate}, revision.Config{BatchBytes: 1 << 30, Observe: func(n, _ int, _ time.Duration) {
		mu.Lock()
		batches = append(batches, n)
		mu.Unlock()
	}})
	defer seq.Stop()
	sizes := []int{3 << 20, 3 << 20, 12 << 20, 3 << 20, 3 << 20, 2 << 20}
	errs := make([]error, len(sizes))
	revs := make([]int64, len(sizes))
	var wg sync.WaitGroup
	// A first request holds the lead until the rest have been submitted;
	// they then form one batch of 26 MiB.
	first := make(chan error, 1)
	go func() { _, err := seq.Do(context.Background(), sized{gate: gate}, 1); first <- err }()
	started := make(chan struct{}, len(sizes))
	for i, n := range sizes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started <- struct{}{}
			revs[i], errs[i] = seq.Do(context.Background(), sized{n: n}, n)
		}()
	}
	for range sizes {
		<-started
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i, err := range errs {
		if sizes[i] > storage.MaxTransactionBytes {
			if !errors.Is(err, revision.ErrTooLarge) {
				t.Fatalf("request of %d bytes: %v, want ErrTooLarge", sizes[i], err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("request of %d bytes: %v", sizes[i], err)
		}
		if r := revs[i]; seen[r] {
			t.Fatalf("revision %d twice", r)
		} else {
			seen[r] = true
		}
	}
	// Batches of several requests were refused and split: more refusals
	// than the one request too large alone, and batches of several
	// requests committed.
	mu.Lock()
	defer mu.Unlock()
	multi := 0
	for _, n := range batches {
		if n > 1 {
			multi++
		}
	}
	if db.Stats.LimitErrors.Load() < 2 || multi == 0 {
		t.Fatalf("%d refusals, committed batches %v: no batch was split", db.Stats.LimitErrors.Load(), batches)
	}
}

// TestCommitTimeout: a batch that cannot commit (every attempt conflicts)
// is answered ErrTimeout once CommitTimeout has passed, instead of holding
// the sequencer; the next request commits normally.
func TestCommitTimeout(t *testing.T) {
	db := faulty.Wrap(openDB(t), faulty.Options{RetryProbability: 1})
	seq := revision.New[int64](db, recorder{}, revision.Config{CommitTimeout: 200 * time.Millisecond})
	defer seq.Stop()
	if _, err := seq.Do(context.Background(), key("stuck"), 10); !errors.Is(err, revision.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	db.SetOptions(faulty.Options{})
	if r, err := seq.Do(context.Background(), key("next"), 10); err != nil || r != 2 {
		t.Fatalf("after the timeout: revision %v, %v; want 2", r, err)
	}
}

// slow is a request that takes a second of the clock to evaluate, and
// counts its evaluations.
type slow struct {
	key
	clock *fakeclock.Clock
	count *evaluations
}

type evaluations struct {
	mu sync.Mutex
	n  map[key]int
}

func (r slow) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (int64, bool, error, error) {
	r.clock.Advance(time.Second)
	r.count.mu.Lock()
	r.count.n[r.key]++
	r.count.mu.Unlock()
	return r.key.Apply(tx, env, rev, id)
}

// TestCutBatchKeepsItsDeadline: a batch whose attempts grow slow is cut in
// half and retried, but every cut runs under the deadline of the batch's
// first attempt: once CommitTimeout has passed its requests are answered
// ErrTimeout, instead of the cuts each starting a CommitTimeout of their
// own (a batch of 1,024 requests could hold the sequencer ten times as
// long).
func TestCutBatchKeepsItsDeadline(t *testing.T) {
	clock := fakeclock.New(time.Unix(1e9, 0))
	g := gate{holding: make(chan struct{}, 1), release: make(chan struct{})}
	count := &evaluations{n: map[key]int{}}
	db := faulty.Wrap(openDB(t), faulty.Options{})
	seq := revision.New[int64](db, recorder{}, revision.Config{CommitTimeout: time.Second, Now: clock.Now})
	defer seq.Stop()
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	defer release()
	heldErr := make(chan error, 1)
	go func() { _, err := seq.Do(context.Background(), held{key("hold"), g}, 10); heldErr <- err }()
	<-g.holding
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		r := slow{key(fmt.Sprintf("r%d", i)), clock, count}
		ctx := newQueuedCtx(context.Background())
		go func() { _, err := seq.Do(ctx, r, 10); errs <- err }()
		awaitQueued(t, ctx)
	}
	// From now on no attempt commits; "hold" too times out.
	db.SetOptions(faulty.Options{RetryProbability: 1})
	release()
	if err := <-heldErr; !errors.Is(err, revision.ErrTimeout) {
		t.Fatalf("hold: got %v, want ErrTimeout", err)
	}
	for range n {
		if err := <-errs; !errors.Is(err, revision.ErrTimeout) {
			t.Fatalf("got %v, want ErrTimeout", err)
		}
	}
	// r0 is in every cut of the batch. Its first attempt took 8 s of the
	// clock, past the 1 s deadline: the batch is answered at its first cut.
	count.mu.Lock()
	defer count.mu.Unlock()
	if got := count.n["r0"]; got > 2 {
		t.Fatalf("the first request was evaluated %d times; its batch went on being cut and retried past CommitTimeout", got)
	}
}
