package revision_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// counter writes a request of n keys: "c/<i>" = the revision it takes, and
// logs the revision. More than stageAbove keys are staged, 100 per
// transaction; after each staged chunk it calls chunkDone, if set.
type counter struct {
	db        storage.DB
	chunkDone func(chunk int)
}

const stageAbove = 300

func (counter) Begin(storage.ReadTx) (revision.Env, error) { return revision.Env{}, nil }

// count is counter's request: n keys.
type count int

func (n count) Apply(tx storage.Tx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	if n > stageAbove {
		return 0, false, revision.ErrStage, nil
	}
	writeCounted(tx, rev+1, 0, int(n))
	return rev + 1, true, nil, nil
}

func (count) Replay(_ storage.ReadTx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	return rev + 1, true, nil, nil
}

func writeCounted(tx storage.Tx, rev int64, from, to int) {
	for i := from; i < to; i++ {
		tx.Set(fmt.Appendf(nil, "c/%06d", i), fmt.Appendf(nil, "%d", rev))
	}
	if from == 0 {
		tx.Set(keyspace.Log(rev, 0), []byte("x"))
	}
}

func (n count) Reserve(storage.ReadTx, revision.Env, int64) ([]byte, error, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(n)), nil, nil
}

func (c counter) Stage(ctx context.Context, r revision.Reservation, _ bool) (int64, bool, error) {
	n := int(binary.BigEndian.Uint64(r.Req))
	for chunk := 0; chunk*100 < n; chunk++ {
		err := c.db.Update(ctx, func(tx storage.Tx) error {
			if err := r.Check(tx); err != nil {
				return err
			}
			writeCounted(tx, r.Base+1, chunk*100, min(n, chunk*100+100))
			return nil
		})
		if err != nil {
			return 0, false, err
		}
		if c.chunkDone != nil {
			c.chunkDone(chunk)
		}
	}
	return r.Base + 1, n > 0, nil
}

func (counter) Publish(storage.Tx, revision.Reservation, bool) error { return nil }

func headOf(t *testing.T, db storage.DB) int64 {
	t.Helper()
	var h revision.Head
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		var err error
		h, err = revision.ReadHead(tx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return h.Rev
}

func countedAt(t *testing.T, db storage.DB, rev int64) int {
	t.Helper()
	n := 0
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange([]byte("c/"), []byte("c0"), storage.RangeOptions{})
		n = 0
		for _, kv := range kvs {
			if string(kv.Value) == fmt.Sprint(rev) {
				n++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStagedRequest: a request too large for a batch is staged in several
// transactions while the head stays put, and writes of another writer on
// the same storage wait for it: it takes the next revision whole, and they
// the ones after. Every storage commit is reported as unknown result and
// retried (faulty), so every step of staging repeats on top of itself.
func TestStagedRequest(t *testing.T) {
	raw := openDB(t)
	db := faulty.Wrap(raw, faulty.Options{Seed: 3, CommitUnknownProbability: 1, RetryProbability: 0.2})
	var other *revision.Sequencer[int64]
	otherDone := make(chan error, 1)
	otherRev := make(chan int64, 1)
	c := counter{db: db}
	c.chunkDone = func(chunk int) {
		if chunk != 2 {
			return
		}
		if h := headOf(t, db); h != 1 {
			t.Errorf("head %d while staging, want 1", h)
		}
		go func() { // another writer, while the reservation is pending
			r, err := other.Do(context.Background(), count(5), 5)
			if err == nil {
				otherRev <- r
			}
			otherDone <- err
		}()
	}
	seq := revision.New[int64](db, c, revision.Config{BeatTimeout: time.Minute})
	defer seq.Stop()
	other = revision.New[int64](db, counter{db: db}, revision.Config{BeatTimeout: time.Minute})
	defer other.Stop()
	r, err := seq.Do(context.Background(), count(1000), 10)
	if err != nil || r != 2 {
		t.Fatalf("staged request: revision %v, %v; want 2", r, err)
	}
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
	if r := <-otherRev; r != 3 {
		t.Fatalf("the other writer took revision %d, want 3", r)
	}
	if h := headOf(t, raw); h != 3 {
		t.Fatalf("head %d, want 3", h)
	}
	if n := countedAt(t, raw, 2); n != 1000-5 {
		t.Fatalf("%d keys of revision 2 left, want 995", n)
	}
	if db.Stats.Unknowns.Load() == 0 {
		t.Fatal("no unknown results injected")
	}
}

// cutDB stops answering once cut, as the storage connection of a process
// that died would.
type cutDB struct {
	storage.DB
	cut atomic.Bool
}

var errCut = errors.New("cut off")

func (d *cutDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	if d.cut.Load() {
		return errCut
	}
	return d.DB.Update(ctx, fn)
}

func (d *cutDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if d.cut.Load() {
		return errCut
	}
	return d.DB.View(ctx, fn)
}

// TestStagedRequestTakenOver: a writer that reserved and half staged a
// request is cut off. Two other writers' requests wait until the beat stands
// still for BeatTimeout; one of them takes the staged request over and
// finishes it (same writes, the first writer's batch marker), and both
// commit after it. The first writer's caller was told its outcome is
// unknown.
func TestStagedRequestTakenOver(t *testing.T) {
	raw := openDB(t)
	dying := &cutDB{DB: raw}
	c := counter{db: dying}
	c.chunkDone = func(chunk int) {
		if chunk == 3 {
			dying.cut.Store(true)
		}
	}
	a := revision.New[int64](dying, c, revision.Config{})
	defer a.Stop()
	if _, err := a.Do(context.Background(), count(1000), 10); !errors.Is(err, revision.ErrTimeout) {
		t.Fatalf("cut-off staged request: %v, want ErrTimeout", err)
	}
	if h, n := headOf(t, raw), countedAt(t, raw, 2); h != 1 || n != 400 {
		t.Fatalf("after the cut: head %d, %d keys staged; want 1 and 400", h, n)
	}
	// Two writers wait for it; either may take it over (the other then
	// waits for that one), every commit of theirs reported as unknown
	// result and retried.
	cfg := revision.Config{BeatInterval: 10 * time.Millisecond, BeatTimeout: 200 * time.Millisecond}
	revs := make(chan int64, 2)
	errs := make(chan error, 2)
	for i := range 2 {
		db := faulty.Wrap(raw, faulty.Options{Seed: int64(i), CommitUnknownProbability: 1})
		w := revision.New[int64](db, counter{db: db}, cfg)
		defer w.Stop()
		go func() {
			r, err := w.Do(context.Background(), count(5), 5)
			if err == nil {
				revs <- r
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("request after the takeover: %v", err)
		}
	}
	if r1, r2 := <-revs, <-revs; min(r1, r2) != 3 || max(r1, r2) != 4 {
		t.Fatalf("the waiting writers took revisions %d and %d, want 3 and 4", r1, r2)
	}
	if n := countedAt(t, raw, 2); n != 995 {
		t.Fatalf("%d keys of revision 2, want 995", n)
	}
	if n := countedAt(t, raw, 3) + countedAt(t, raw, 4); n != 5 {
		t.Fatalf("%d keys of revisions 3 and 4, want 5", n)
	}
}

// TestSettle: Settle returns at once with nothing in flight, and otherwise
// once the batch in flight is decided.
func TestSettle(t *testing.T) {
	gate := make(chan struct{})
	seq := revision.New[int64](openDB(t), sized{gate: gate}, revision.Config{})
	defer seq.Stop()
	if err := seq.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_, _ = seq.Do(context.Background(), sized{gate: gate}, 1)
		close(done)
	}()
	// Once the batch is in flight (at the gate), Settle waits for it:
	// it returns nil only while nothing is in flight.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := seq.Settle(ctx)
		cancel()
		if err != nil {
			break
		}
		select {
		case <-done:
			t.Fatal("the gated batch finished before the gate opened")
		default:
		}
	}
	close(gate)
	if err := seq.Settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-done
}

// waitSignal reports each WaitChange, the wait for a staged write to be
// published.
type waitSignal struct {
	storage.DB
	waiting chan struct{}
}

func (d *waitSignal) WaitChange(ctx context.Context, key, seen []byte) error {
	select {
	case d.waiting <- struct{}{}:
	default:
	}
	return d.DB.WaitChange(ctx, key, seen)
}

// TestCanceledWhileAwaitingStagedWrite: a request that waits for another
// writer's staged request to be published (seconds, for a large one) goes
// back to the queue meanwhile, so its caller can give up; it is never
// applied, and the next request takes the revision after the staged one.
func TestCanceledWhileAwaitingStagedWrite(t *testing.T) {
	raw := openDB(t)
	staging, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	c := counter{db: raw, chunkDone: func(chunk int) {
		if chunk == 2 {
			staging <- struct{}{}
			<-release
		}
	}}
	seq := revision.New[int64](raw, c, revision.Config{BeatTimeout: time.Minute})
	defer seq.Stop()
	defer releaseOnce.Do(func() { close(release) }) // before Stop, which waits for the staging
	staged := make(chan error, 1)
	go func() { _, err := seq.Do(context.Background(), count(1000), 10); staged <- err }()
	<-staging
	db := &waitSignal{DB: raw, waiting: make(chan struct{}, 1)}
	other := revision.New[int64](db, counter{db: db}, revision.Config{BeatTimeout: time.Minute})
	defer other.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	canceled := make(chan error, 1)
	go func() { _, err := other.Do(ctx, count(5), 5); canceled <- err }()
	<-db.waiting
	cancel()
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a canceled request waits for another writer's staged request to be published")
	}
	releaseOnce.Do(func() { close(release) })
	if err := <-staged; err != nil {
		t.Fatal(err)
	}
	if r, err := other.Do(context.Background(), count(6), 6); err != nil || r != 3 {
		t.Fatalf("next request: revision %v, %v; want 3", r, err)
	}
	if h, n := headOf(t, raw), countedAt(t, raw, 3); h != 3 || n != 6 {
		t.Fatalf("head %d with %d keys of revision 3; want 3 and 6 (the canceled request not applied)", h, n)
	}
}

// markerSeqs returns the seqs of the batch markers in db, by writer.
func markerSeqs(t *testing.T, db storage.DB) map[uint64][]uint64 {
	t.Helper()
	out := map[uint64][]uint64{}
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		begin, end := keyspace.BatchAll()
		kvs, err := tx.GetRange(begin, end, storage.RangeOptions{})
		for _, kv := range kvs {
			// keyspace.Batch: a family byte, the writer and the seq.
			k := kv.Key[len(kv.Key)-16:]
			w := binary.BigEndian.Uint64(k)
			out[w] = append(out[w], binary.BigEndian.Uint64(k[8:]))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStagedMarkersCleared: a writer's next write clears the batch markers
// of its staged requests, as it clears its previous batch's: nothing
// replays them once they are decided, and markers left behind would hold
// physical compaction back until they expire. Every write of the writer
// leaves exactly its own newest marker, also when every commit is
// reported as unknown result and retried.
func TestStagedMarkersCleared(t *testing.T) {
	for _, unknown := range []float64{0, 1} {
		t.Run(fmt.Sprintf("unknown=%v", unknown), func(t *testing.T) {
			raw := openDB(t)
			db := faulty.Wrap(raw, faulty.Options{Seed: 5, CommitUnknownProbability: unknown})
			w := revision.New[int64](db, counter{db: db}, revision.Config{BeatTimeout: time.Minute})
			defer w.Stop()
			for i, n := range []count{1, 1000, 1000, 2, 1000, 3, 4} {
				if _, err := w.Do(context.Background(), n, int(n)); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				ms := markerSeqs(t, raw)
				if len(ms) != 1 {
					t.Fatalf("after write %d: markers of %d writers, want 1", i, len(ms))
				}
				for _, seqs := range ms {
					if len(seqs) != 1 {
						t.Fatalf("after write %d (of %d keys): markers %v left, want only the newest", i, n, seqs)
					}
				}
			}
		})
	}
}

// TestTakenOverMarkerCleared: a staged request whose writer was cut off
// is published by another writer, with the first writer's batch marker.
// Once the first writer writes again, that marker goes: it is decided, and
// nobody else clears it.
func TestTakenOverMarkerCleared(t *testing.T) {
	raw := openDB(t)
	flaky := &cutDB{DB: raw}
	c := counter{db: flaky}
	c.chunkDone = func(chunk int) {
		if chunk == 3 {
			flaky.cut.Store(true)
		}
	}
	a := revision.New[int64](flaky, c, revision.Config{})
	defer a.Stop()
	if _, err := a.Do(context.Background(), count(1000), 10); !errors.Is(err, revision.ErrTimeout) {
		t.Fatalf("cut-off staged request: %v, want ErrTimeout", err)
	}
	b := revision.New[int64](raw, counter{db: raw}, revision.Config{BeatInterval: 10 * time.Millisecond, BeatTimeout: 200 * time.Millisecond})
	defer b.Stop()
	if r, err := b.Do(context.Background(), count(5), 5); err != nil || r != 3 {
		t.Fatalf("request after the takeover: revision %v, %v; want 3", r, err)
	}
	if ms := markerSeqs(t, raw); len(ms) != 2 {
		t.Fatalf("markers of %d writers after the takeover, want 2 (the staged request's, the other writer's)", len(ms))
	}
	flaky.cut.Store(false)
	if r, err := a.Do(context.Background(), count(6), 6); err != nil || r != 4 {
		t.Fatalf("the first writer's next request: revision %v, %v; want 4", r, err)
	}
	for w, seqs := range markerSeqs(t, raw) {
		if len(seqs) != 1 {
			t.Fatalf("writer %x: markers %v left, want only the newest", w, seqs)
		}
	}
}
