package revision_test

import (
	"bytes"
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
)

// lateDB is FoundationDB's commit_unknown_result at its least convenient:
// the first commit of an armed Update is reported unknown without having
// landed yet; the retry runs (and reads nothing of it), and the commit
// lands afterwards, just before the landAt-th Update that follows starts —
// unless a commit in between wrote a key it read, which FoundationDB's
// conflict check would refuse it for.
type lateDB struct {
	storage.DB
	clock *fakeclock.Clock

	mu      sync.Mutex
	armed   bool
	landAt  int     // Updates to start before the held commit lands
	held    *record // the commit that lands late
	since   []span  // keys written by the commits since held read
	landed  bool
	refused bool
}

// span is a key (end nil) or a range of keys.
type span struct{ begin, end []byte }

func (s span) overlaps(o span) bool {
	sEnd, oEnd := s.end, o.end
	if sEnd == nil {
		sEnd = append(bytes.Clone(s.begin), 0)
	}
	if oEnd == nil {
		oEnd = append(bytes.Clone(o.begin), 0)
	}
	return bytes.Compare(s.begin, oEnd) < 0 && bytes.Compare(o.begin, sEnd) < 0
}

// record is one transaction's reads and writes.
type record struct {
	reads, writes []span
	ops           []func(storage.Tx)
}

// recordingTx records what a transaction reads and writes; slow advances
// the clock by three seconds at the first write, as a run that took that
// long would.
type recordingTx struct {
	storage.Tx
	rec  *record
	slow *fakeclock.Clock
}

func (t *recordingTx) Get(k []byte) ([]byte, error) {
	t.rec.reads = append(t.rec.reads, span{begin: bytes.Clone(k)})
	return t.Tx.Get(k)
}

func (t *recordingTx) GetMany(ks [][]byte) ([][]byte, error) {
	for _, k := range ks {
		t.rec.reads = append(t.rec.reads, span{begin: bytes.Clone(k)})
	}
	return t.Tx.GetMany(ks)
}

func (t *recordingTx) GetRange(b, e []byte, o storage.RangeOptions) ([]storage.KeyValue, error) {
	t.rec.reads = append(t.rec.reads, span{begin: bytes.Clone(b), end: bytes.Clone(e)})
	return t.Tx.GetRange(b, e, o)
}

func (t *recordingTx) write(s span, op func(storage.Tx)) {
	if t.slow != nil {
		t.slow.Advance(3 * time.Second)
		t.slow = nil
	}
	t.rec.writes = append(t.rec.writes, s)
	t.rec.ops = append(t.rec.ops, op)
	op(t.Tx)
}

func (t *recordingTx) Set(k, v []byte) {
	k, v = bytes.Clone(k), bytes.Clone(v)
	t.write(span{begin: k}, func(tx storage.Tx) { tx.Set(k, v) })
}

func (t *recordingTx) Clear(k []byte) {
	k = bytes.Clone(k)
	t.write(span{begin: k}, func(tx storage.Tx) { tx.Clear(k) })
}

func (t *recordingTx) ClearRange(b, e []byte) {
	b, e = bytes.Clone(b), bytes.Clone(e)
	t.write(span{begin: b, end: e}, func(tx storage.Tx) { tx.ClearRange(b, e) })
}

var errHeld = errors.New("lateDB: commit held back")

func (d *lateDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	if err := d.land(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	armed := d.armed
	d.armed = false
	d.mu.Unlock()
	if armed {
		held := &record{}
		err := d.DB.Update(ctx, func(tx storage.Tx) error {
			*held = record{}
			if err := fn(&recordingTx{Tx: tx, rec: held, slow: d.clock}); err != nil {
				return err
			}
			return errHeld // rolled back here; it lands later
		})
		if !errors.Is(err, errHeld) {
			return fmt.Errorf("lateDB: the armed run did not commit: %v", err)
		}
		d.mu.Lock()
		d.held = held
		d.mu.Unlock()
	}
	// The retry, or an ordinary Update.
	rec := &record{}
	err := d.DB.Update(ctx, func(tx storage.Tx) error {
		*rec = record{}
		return fn(&recordingTx{Tx: tx, rec: rec})
	})
	if err == nil {
		d.mu.Lock()
		if d.held != nil {
			d.since = append(d.since, rec.writes...)
		}
		d.mu.Unlock()
	}
	return err
}

// land commits the held transaction when its turn comes, unless a commit
// since it read wrote something it read.
func (d *lateDB) land(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held == nil {
		return nil
	}
	if d.landAt--; d.landAt > 0 {
		return nil
	}
	held := d.held
	d.held = nil
	for _, w := range d.since {
		for _, r := range held.reads {
			if w.overlaps(r) {
				d.refused = true
				return nil
			}
		}
	}
	d.landed = true
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		for _, op := range held.ops {
			op(tx)
		}
		return nil
	})
}

// logged returns the keys the revision log holds, by revision.
func logged(t *testing.T, db storage.DB) map[int64]string {
	t.Helper()
	out := map[int64]string{}
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(keyspace.LogFrom(0), keyspace.LogFrom(1<<40), storage.RangeOptions{})
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			rev, _, err := keyspace.ParseLog(kv.Key)
			if err != nil {
				return err
			}
			out[rev] = string(kv.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A batch whose commit was reported unknown and whose retry then cuts it
// (the first run was slow) must not give its requests to a new batch while
// that commit can still land: each request is applied exactly once, at the
// revision it is answered with, whether the commit lands before the cut
// requests are committed again (it is found and answered from) or would
// land after (it is fenced off).
func TestUnknownCommitThenCutAppliesOnce(t *testing.T) {
	for _, landAt := range []int{1, 2} {
		t.Run(fmt.Sprintf("lands-before-update-%d", landAt), func(t *testing.T) {
			clock := fakeclock.New(time.Unix(1_700_000_000, 0))
			db := &lateDB{DB: openDB(t), clock: clock, landAt: landAt}
			g := gate{holding: make(chan struct{}, 1), release: make(chan struct{})}
			seq := revision.New[int64](db, recorder{}, revision.Config{Now: clock.Now, CommitTimeout: time.Minute})
			defer seq.Stop()
			heldErr := make(chan error, 1)
			go func() { _, err := seq.Do(context.Background(), held{key("hold"), g}, 10); heldErr <- err }()
			<-g.holding
			// a and b queue behind the held request and form the next batch.
			type answer struct {
				rev int64
				err error
			}
			answers := map[string]chan answer{"a": make(chan answer, 1), "b": make(chan answer, 1)}
			for _, k := range []string{"a", "b"} {
				ctx := newQueuedCtx(context.Background())
				go func() {
					r, err := seq.Do(ctx, key(k), 10)
					answers[k] <- answer{r, err}
				}()
				awaitQueued(t, ctx)
			}
			db.mu.Lock()
			db.armed = true
			db.mu.Unlock()
			close(g.release)
			if err := <-heldErr; err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for k, ch := range answers {
				a := <-ch
				if a.err != nil {
					t.Fatalf("%s: %v", k, a.err)
				}
				got[k] = a.rev
			}
			// The next write lands the held commit if it is still due.
			if _, err := seq.Do(context.Background(), key("c"), 10); err != nil {
				t.Fatal(err)
			}
			db.mu.Lock()
			landed, refused := db.landed, db.refused
			db.mu.Unlock()
			if !landed && !refused {
				t.Fatal("the held commit was neither landed nor refused: the test did not exercise the late commit")
			}
			log := logged(t, db)
			count := map[string]int{}
			for _, k := range log {
				count[k]++
			}
			for _, k := range []string{"a", "b"} {
				if count[k] != 1 || log[got[k]] != k {
					t.Errorf("request %s answered with revision %d, applied %d times (log %v)", k, got[k], count[k], log)
				}
			}
			t.Logf("held commit landed %v, refused %v; log %v", landed, refused, log)
		})
	}
}
