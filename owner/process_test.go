package owner

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// keyspaceDB is one keyspace under prefix in a store that several share,
// whose own keys (the processes' beats) lie outside every prefix: what
// package tenant gives an elector, without its fences and batching.
type keyspaceDB struct {
	inner  storage.DB
	prefix []byte
	// records counts the writes to the keyspace's ownership record.
	records *atomic.Int64
}

func (d *keyspaceDB) tx(tx storage.ReadTx, w storage.Tx) *prefixTx {
	return &prefixTx{r: tx, w: w, p: d.prefix, records: d.records}
}

func (d *keyspaceDB) Update(ctx context.Context, fn func(tx storage.Tx) error) error {
	return d.inner.Update(ctx, func(tx storage.Tx) error { return fn(d.tx(tx, tx)) })
}

func (d *keyspaceDB) View(ctx context.Context, fn func(tx storage.ReadTx) error) error {
	return d.inner.View(ctx, func(tx storage.ReadTx) error { return fn(d.tx(tx, nil)) })
}

func (d *keyspaceDB) WaitChange(ctx context.Context, k, seen []byte) error {
	return d.inner.WaitChange(ctx, append(bytes.Clone(d.prefix), k...), seen)
}

func (d *keyspaceDB) Close() error { return nil }

func (d *keyspaceDB) UpdateShared(ctx context.Context, _, _ [][]byte, fn func(tx, outer storage.Tx) error) error {
	return d.inner.Update(ctx, func(tx storage.Tx) error { return fn(d.tx(tx, tx), tx) })
}

// prefixTx runs a keyspace's reads and writes under its prefix.
type prefixTx struct {
	r       storage.ReadTx
	w       storage.Tx
	p       []byte
	records *atomic.Int64
}

func (t *prefixTx) k(k []byte) []byte { return append(bytes.Clone(t.p), k...) }

func (t *prefixTx) Get(k []byte) ([]byte, error) { return t.r.Get(t.k(k)) }

func (t *prefixTx) GetMany(keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = t.k(k)
	}
	return t.r.GetMany(out)
}

func (t *prefixTx) GetRange(b, e []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	kvs, err := t.r.GetRange(t.k(b), t.k(e), opt)
	for i := range kvs {
		kvs[i].Key = kvs[i].Key[len(t.p):]
	}
	return kvs, err
}

func (t *prefixTx) Set(k, v []byte) {
	if bytes.Equal(k, key) {
		t.records.Add(1)
	}
	t.w.Set(t.k(k), v)
}

func (t *prefixTx) Clear(k []byte)         { t.w.Clear(t.k(k)) }
func (t *prefixTx) ClearRange(b, e []byte) { t.w.ClearRange(t.k(b), t.k(e)) }

// proc is a process: its beat and its electors, on one clock.
type proc struct {
	p       *Process
	clk     *fakeclock.Clock
	loops   int // the goroutines asleep on clk between steps: the beats' and the ticks' loops
	records atomic.Int64
}

func startProc(t *testing.T, inner storage.DB, at time.Time) *proc {
	t.Helper()
	clk := fakeclock.New(at)
	p := StartProcess(inner, Config{TTL: ttl, RenewInterval: renew, Clock: clk,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	t.Cleanup(p.Stop)
	clk.BlockUntil(t, 2)
	return &proc{p: p, clk: clk, loops: 2}
}

// keyspace is keyspace number n of inner, as pr sees it.
func (pr *proc) keyspace(inner storage.DB, n int) *keyspaceDB {
	return &keyspaceDB{inner: inner, prefix: []byte{0xee, byte(n)}, records: &pr.records}
}

// elect starts pr's elector (URL number n) on keyspace ks.
func (pr *proc) elect(t *testing.T, ks *keyspaceDB, n int) *Elector {
	t.Helper()
	e := Start(ks, Config{URL: url(n), TTL: ttl, RenewInterval: renew, Clock: pr.clk, Process: pr.p,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	t.Cleanup(e.Stop)
	pr.clk.BlockUntil(t, pr.loops) // no loop of its own: it ticks on the process's
	return e
}

// advanceProcs moves the processes' clocks in steps of renew.
func advanceProcs(t *testing.T, d time.Duration, ps ...*proc) {
	t.Helper()
	for ; d > 0; d -= renew {
		for _, p := range ps {
			p.clk.Advance(min(d, renew))
			p.clk.BlockUntil(t, p.loops)
		}
	}
}

// TestProcessBeatsForItsKeyspaces: a process holding three keyspaces
// keeps them with its beat alone, without writing their records, and
// another process's electors see it as their owner throughout.
func TestProcessBeatsForItsKeyspaces(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	b := startProc(t, inner, t0)
	var own, watch []*Elector
	for n := range 3 {
		own = append(own, a.elect(t, a.keyspace(inner, n), 1))
		watch = append(watch, b.elect(t, b.keyspace(inner, n), 2))
	}
	a.records.Store(0)
	b.records.Store(0)
	advanceProcs(t, 5*ttl, a, b)
	for n := range 3 {
		if v := own[n].View(); !v.Held || v.Epoch != 1 || v.ID != a.p.ID() {
			t.Fatalf("keyspace %d's owner after %v: %+v, want holding epoch 1", n, 5*ttl, v)
		}
		if v := watch[n].View(); v.Held || v.ID != a.p.ID() || v.URL != url(1) {
			t.Fatalf("keyspace %d's other replica: %+v, want a's record", n, v)
		}
	}
	if n := a.records.Load() + b.records.Load(); n != 0 {
		t.Errorf("%d writes of ownership records while the owning process beat; want 0", n)
	}
}

// TestElectorsTickOnTheProcess: an elector that joins a process ticks on
// the process's loop and costs no goroutine of its own, and it still
// keeps its keyspace (and another process's electors still follow it).
func TestElectorsTickOnTheProcess(t *testing.T) {
	const n = 50
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	b := startProc(t, inner, t0)
	before := runtime.NumGoroutine()
	var own, watch []*Elector
	for i := range n {
		own = append(own, a.elect(t, a.keyspace(inner, i), 1))
		watch = append(watch, b.elect(t, b.keyspace(inner, i), 2))
	}
	if extra := runtime.NumGoroutine() - before; extra >= n {
		t.Errorf("%d electors on two processes added %d goroutines; want none of their own", 2*n, extra)
	}
	advanceProcs(t, 2*ttl, a, b)
	for i := range n {
		if v := own[i].View(); !v.Held || v.Epoch != 1 {
			t.Fatalf("keyspace %d's owner after %v: %+v, want holding epoch 1", i, 2*ttl, v)
		}
		if v := watch[i].View(); v.Held || v.ID != a.p.ID() {
			t.Fatalf("keyspace %d's other replica: %+v, want a's record", i, v)
		}
	}
}

// TestStalledProcessLosesItsKeyspaces: when a process's beats stop (its
// clock stands still, as in a long pause), the other process takes over
// each of its keyspaces once the beat has stood still for TTL, fences it
// off, and the stalled process, when it resumes, learns of the takeovers
// from its deposal mark instead of holding on through its beats.
func TestStalledProcessLosesItsKeyspaces(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	b := startProc(t, inner, t0)
	var own, other []*Elector
	var dbs []*keyspaceDB
	for n := range 2 {
		dbs = append(dbs, b.keyspace(inner, n))
		own = append(own, a.elect(t, a.keyspace(inner, n), 1))
		other = append(other, b.elect(t, dbs[n], 2))
	}
	advanceProcs(t, ttl-renew, b)
	for n := range 2 {
		if v := other[n].View(); v.Held {
			t.Fatalf("keyspace %d taken over %v after a's last beat: %+v", n, ttl-renew, v)
		}
	}
	advanceProcs(t, 2*renew, b)
	for n := range 2 {
		if v := other[n].View(); !v.Held || v.Epoch != 2 {
			t.Fatalf("keyspace %d after a stood still for TTL: %+v, want b holding epoch 2", n, v)
		}
		if !fenced(t, dbs[n], &replica{e: own[n]}, 1) || fenced(t, dbs[n], &replica{e: other[n]}, 2) {
			t.Fatalf("keyspace %d: a's epoch 1 must be fenced off, b's epoch 2 not", n)
		}
	}
	advanceProcs(t, 2*renew, a)
	for n := range 2 {
		if v := own[n].View(); v.Held || v.ID != b.p.ID() || v.URL != url(2) {
			t.Fatalf("keyspace %d, a after resuming: %+v, want b's record", n, v)
		}
	}
}

// TestProcessFindsUnmarkedTakeover: a takeover that leaves no deposal mark
// (a replica of an earlier version, which rewrites its record every
// renewal) is found by the owner's periodic read of its record within
// verifyEvery intervals, although its process keeps beating.
func TestProcessFindsUnmarkedTakeover(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	ks := a.keyspace(inner, 0)
	e := a.elect(t, ks, 1)
	for i := range verifyEvery + 2 {
		err := ks.Update(context.Background(), func(tx storage.Tx) error {
			tx.Set(key, record{ID: 99, Epoch: 2, Beat: uint64(i), URL: url(9)}.encode())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		advanceProcs(t, renew, a)
	}
	if v := e.View(); v.Held || v.ID != 99 || v.Epoch != 2 {
		t.Fatalf("after %d intervals of an earlier version's owner: %+v, want its record", verifyEvery+2, v)
	}
}

// TestProcessRetakesItsOwnRecord: a record that names this process under
// an epoch its elector does not hold (an earlier elector of the process on
// this keyspace, stopped without handing it back) is taken with the next
// epoch at once: the process's own beats would otherwise keep it alive and
// the keyspace ownerless.
func TestProcessRetakesItsOwnRecord(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	ks := a.keyspace(inner, 0)
	err := ks.Update(context.Background(), func(tx storage.Tx) error {
		tx.Set(key, record{ID: a.p.ID(), Epoch: 5, URL: url(1), Process: true}.encode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e := a.elect(t, ks, 1)
	if v := e.View(); !v.Held || v.Epoch != 6 {
		t.Fatalf("elector over its process's earlier record: %+v, want holding epoch 6", v)
	}
}

// TestStoppedProcessLetsGo: once a process stops beating, its electors
// stop believing they hold their keyspaces TTL after its last beat.
func TestStoppedProcessLetsGo(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	e := a.elect(t, a.keyspace(inner, 0), 1)
	advanceProcs(t, 2*ttl, a)
	if v := e.View(); !v.Held {
		t.Fatalf("with the process beating: %+v, want holding", v)
	}
	a.p.Stop()
	a.loops = 0
	advanceProcs(t, ttl, a)
	if v := e.View(); v.Held {
		t.Fatalf("%v after the process's last beat: %+v, want not holding", ttl, v)
	}
}

// TestFencedOwnerReadsAgain: an owner whose process beats for it, fenced
// off by a takeover it has not read yet (here one that leaves no deposal
// mark), reads its record within a refresh gap of the failed fence rather
// than at its next periodic read.
func TestFencedOwnerReadsAgain(t *testing.T) {
	inner := testdb.Open(t)
	a := startProc(t, inner, t0)
	ks := a.keyspace(inner, 0)
	e := a.elect(t, ks, 1)
	err := ks.Update(context.Background(), func(tx storage.Tx) error {
		tx.Set(key, record{ID: 99, Epoch: 2, URL: url(9)}.encode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	changed := e.Changed()
	if !fenced(t, ks, &replica{e: e}, 1) {
		t.Fatal("epoch 1 not fenced off after the takeover")
	}
	a.clk.BlockUntil(t, a.loops) // the elector waits out its refresh gap
	a.clk.Advance(renew / refreshGap)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the failed fence did not make the owner read its record")
	}
	a.clk.BlockUntil(t, a.loops)
	if v := e.View(); v.Held || v.ID != 99 {
		t.Fatalf("after the fence failed: %+v, want the new owner's record", v)
	}
}
