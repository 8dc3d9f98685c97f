package mvcc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// viewMeter records the bytes each View transaction reads, and can run a
// hook between Views.
type viewMeter struct {
	storage.DB
	mu    sync.Mutex
	views []int
	// after, when set, runs after the n-th View (counting from 1).
	after func(n int)
}

func (m *viewMeter) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	var n int
	err := m.DB.View(ctx, func(tx storage.ReadTx) error {
		n = 0
		return fn(&meteredTx{ReadTx: tx, n: &n})
	})
	m.mu.Lock()
	m.views = append(m.views, n)
	count, after := len(m.views), m.after
	m.mu.Unlock()
	if after != nil {
		after(count)
	}
	return err
}

// reset forgets the Views recorded so far and returns them.
func (m *viewMeter) reset() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.views
	m.views = nil
	return v
}

type meteredTx struct {
	storage.ReadTx
	n *int
}

func (t *meteredTx) Get(key []byte) ([]byte, error) {
	v, err := t.ReadTx.Get(key)
	*t.n += len(key) + len(v)
	return v, err
}

func (t *meteredTx) GetMany(keys [][]byte) ([][]byte, error) {
	vs, err := t.ReadTx.GetMany(keys)
	for i := range vs {
		*t.n += len(keys[i]) + len(vs[i])
	}
	return vs, err
}

func (t *meteredTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	kvs, err := t.ReadTx.GetRange(begin, end, opt)
	for _, kv := range kvs {
		*t.n += len(kv.Key) + len(kv.Value)
	}
	return kvs, err
}

func value(key string, n int, gen int) []byte {
	v := bytes.Repeat([]byte{byte(gen)}, n)
	copy(v, key)
	return v
}

// bigRevision writes keys k/00.. with chunked values twice and then deletes
// them all at one revision, whose log is far larger than budget once the
// previous values are read. It returns the delete's revision.
func bigRevision(t *testing.T, s *mvcc.Store, keys, size int) int64 {
	t.Helper()
	ctx := context.Background()
	for gen := 1; gen <= 2; gen++ {
		for i := 0; i < keys; i++ {
			k := fmt.Sprintf("k/%02d", i)
			if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: value(k, size, gen)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Deleted != int64(keys) {
		t.Fatalf("deleted %d keys, want %d", d.Deleted, keys)
	}
	return d.Header.Revision
}

// A revision whose events and previous values are many times the budget is
// read whole, in transactions that each stay near the budget.
func TestWatchReadSplitsRevisionLargerThanBudget(t *testing.T) {
	m := &viewMeter{DB: openPebble(t)}
	s := openStore(t, m, mvcc.Config{})
	const keys, size, budget = 40, 150_000, 256 << 10
	rev := bigRevision(t, s, keys, size)
	m.reset()
	b, err := s.ReadWatchEvents(context.Background(), mvcc.WatchRead{From: rev, MaxBytes: budget, PrevKV: true})
	if err != nil {
		t.Fatal(err)
	}
	views := m.reset()
	if b.To != rev || len(b.Revs) != 1 || b.Revs[0].Rev != rev || len(b.Revs[0].Events) != keys {
		t.Fatalf("batch to %d with %d revisions, want revision %d with %d events", b.To, len(b.Revs), rev, keys)
	}
	for i, ev := range b.Revs[0].Events {
		k := fmt.Sprintf("k/%02d", i)
		if ev.Type != mvccpb.DELETE || string(ev.Kv.Key) != k || ev.Kv.ModRevision != rev {
			t.Fatalf("event %d: %v %q@%d", i, ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
		}
		if ev.PrevKv == nil || !bytes.Equal(ev.PrevKv.Value, value(k, size, 2)) {
			t.Fatalf("event %d: wrong previous value", i)
		}
	}
	if b.Reads != len(views) || b.Reads < keys*size/budget {
		t.Fatalf("read in %d transactions (%d metered), want at least %d", b.Reads, len(views), keys*size/budget)
	}
	for i, n := range views {
		if n > 2*budget {
			t.Errorf("transaction %d read %d bytes, budget %d", i, n, budget)
		}
	}
}

// Revisions each within the budget but together far beyond it come back in
// consecutive batches of whole revisions, one transaction each, every
// event exactly once.
func TestWatchReadStopsAtRevisionBoundaries(t *testing.T) {
	m := &viewMeter{DB: openPebble(t)}
	s := openStore(t, m, mvcc.Config{LogTailBytes: -1}) // storage reads: no tail in memory
	ctx := context.Background()
	const n, size, budget = 30, 60_000, 256 << 10
	var first, last int64
	for i := 0; i < n; i++ {
		r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("r/%d", i%7)), Value: value("r", size, i)})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Header.Revision
		}
		last = r.Header.Revision
	}
	m.reset()
	var got []int64
	for from, calls := first, 0; from <= last; calls++ {
		b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: from, MaxBytes: budget, PrevKV: true})
		if err != nil {
			t.Fatal(err)
		}
		if b.Reads != 1 || b.To < from || calls > n {
			t.Fatalf("call %d from %d: %d transactions, to %d", calls, from, b.Reads, b.To)
		}
		for _, re := range b.Revs {
			got = append(got, re.Rev)
			if len(re.Events) != 1 || len(re.Events[0].Kv.Value) != size {
				t.Fatalf("revision %d: %d events", re.Rev, len(re.Events))
			}
		}
		from = b.To + 1
	}
	if len(got) != n || got[0] != first || got[n-1] != last {
		t.Fatalf("revisions %v, want %d..%d", got, first, last)
	}
	for i, v := range m.reset() {
		if v > 2*budget {
			t.Errorf("transaction %d read %d bytes, budget %d", i, v, budget)
		}
	}
}

// A compaction past a revision that is being read in several transactions
// fails the read with ErrCompacted, as if it had come first.
func TestWatchReadCompactedBetweenTransactions(t *testing.T) {
	m := &viewMeter{DB: openPebble(t)}
	s := openStore(t, m, mvcc.Config{LogTailBytes: -1}) // storage reads: no tail in memory
	ctx := context.Background()
	rev := bigRevision(t, s, 12, 150_000)
	p, err := s.Put(ctx, &pb.PutRequest{Key: []byte("after"), Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	m.after = func(n int) {
		once.Do(func() {
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: p.Header.Revision}); err != nil {
				t.Error(err)
			}
		})
	}
	m.reset()
	b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: rev, MaxBytes: 128 << 10, PrevKV: true})
	if !errors.Is(err, mvcc.ErrCompacted) || b.Compacted != p.Header.Revision {
		t.Fatalf("err %v, compacted %d; want ErrCompacted at %d", err, b.Compacted, p.Header.Revision)
	}
}

// Without PrevKV no previous value is read; KeysOnly reads the log alone;
// NoSplit gives up on a revision larger than the budget.
func TestWatchReadOptions(t *testing.T) {
	m := &viewMeter{DB: openPebble(t)}
	s := openStore(t, m, mvcc.Config{LogTailBytes: -1}) // storage reads: no tail in memory
	ctx := context.Background()
	rev := bigRevision(t, s, 10, 150_000)
	m.reset()
	b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: rev})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Revs) != 1 || b.PrevKV || b.Revs[0].Events[0].PrevKv != nil {
		t.Fatalf("without PrevKV: %d revisions, previous value read", len(b.Revs))
	}
	if read := sum(m.reset()); read > 10_000 {
		t.Fatalf("without PrevKV a delete revision read %d bytes", read)
	}
	b, err = s.ReadWatchEvents(ctx, mvcc.WatchRead{From: rev - 1, KeysOnly: true, PrevKV: true})
	if err != nil {
		t.Fatal(err)
	}
	put := b.Revs[0].Events[0]
	if len(b.Revs) != 2 || put.Type != mvccpb.PUT || string(put.Kv.Key) != "k/09" || put.Kv.ModRevision != rev-1 || put.Kv.Value != nil || put.PrevKv != nil {
		t.Fatalf("keys only: %d revisions, first event %v", len(b.Revs), put)
	}
	if read := sum(m.reset()); read > 10_000 {
		t.Fatalf("keys only read %d bytes", read)
	}
	b, err = s.ReadWatchEvents(ctx, mvcc.WatchRead{From: rev, PrevKV: true, NoSplit: true, MaxBytes: 64 << 10})
	if err != nil || len(b.Revs) != 0 || b.To != rev-1 || b.Head != rev {
		t.Fatalf("no split: err %v, %d revisions, to %d head %d", err, len(b.Revs), b.To, b.Head)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// A revision read over several transactions whose last transaction ends
// exactly at its last log part is still returned, once, with every event:
// the next transaction finds nothing more of it (here, nothing at all: it is
// the head), which is how its end shows.
func TestWatchReadRevisionEndingAtATransaction(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, openPebble(t), mvcc.Config{})
	const keys = 200 // about 1 kB per event: three log parts
	long := strings.Repeat("x", 1000)
	for i := 0; i < keys; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("d/%s%03d", long, i)), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("d/"), RangeEnd: []byte("d0")})
	if err != nil || d.Deleted != keys {
		t.Fatalf("delete: %v, %v", d, err)
	}
	// KeysOnly with a budget of one byte reads one log part per transaction.
	for _, from := range []int64{d.Header.Revision, d.Header.Revision - 1} {
		b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: from, MaxBytes: 1, KeysOnly: true})
		for err == nil && b.To < d.Header.Revision && len(b.Revs) > 0 {
			var more mvcc.EventBatch
			more, err = s.ReadWatchEvents(ctx, mvcc.WatchRead{From: b.To + 1, MaxBytes: 1, KeysOnly: true})
			b.Revs, b.To = append(b.Revs, more.Revs...), more.To
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Revs) == 0 {
			t.Fatalf("from %d: read to %d without a revision; want revision %d with %d events", from, b.To, d.Header.Revision, keys)
		}
		last := b.Revs[len(b.Revs)-1]
		if b.To != d.Header.Revision || last.Rev != d.Header.Revision || len(last.Events) != keys {
			t.Fatalf("from %d: read to %d, last revision %d with %d events; want revision %d with %d", from, b.To, last.Rev, len(last.Events), d.Header.Revision, keys)
		}
		for i, ev := range last.Events {
			if want := fmt.Sprintf("d/%s%03d", long, i); string(ev.Kv.Key) != want {
				t.Fatalf("event %d: %.12q..., want key %d", i, ev.Kv.Key, i)
			}
		}
	}
}
