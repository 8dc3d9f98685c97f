package owner

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// TestMain lets `make test-fdb` run this package's tests on FoundationDB.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	ttl   = 4 * time.Second
	renew = time.Second
)

// replica is one elector with its own clock, so a test can stall it or
// skew it against the others.
type replica struct {
	e   *Elector
	clk *fakeclock.Clock
}

func url(n int) string { return "http://r" + string(rune('0'+n)) }

// start starts replica number n (its URL says which) with a clock reading at.
func start(t *testing.T, db storage.DB, n int, at time.Time) *replica {
	t.Helper()
	clk := fakeclock.New(at)
	e := Start(db, Config{URL: url(n), TTL: ttl, RenewInterval: renew, Clock: clk,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	t.Cleanup(e.Stop)
	clk.BlockUntil(t, 1)
	return &replica{e: e, clk: clk}
}

// advance moves the given replicas' clocks in steps of renew, waiting for
// each elector to finish its tick.
func advance(t *testing.T, d time.Duration, rs ...*replica) {
	t.Helper()
	for ; d > 0; d -= renew {
		for _, r := range rs {
			r.clk.Advance(min(d, renew))
			r.clk.BlockUntil(t, 1)
		}
	}
}

func fenced(t *testing.T, db storage.DB, r *replica, epoch uint64) bool {
	t.Helper()
	err := db.View(context.Background(), func(tx storage.ReadTx) error { return r.e.Fence(tx, epoch) })
	if err != nil && !errors.Is(err, ErrNotOwner) {
		t.Fatal(err)
	}
	return err != nil
}

func TestOneOwnerAndTakeover(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	b := start(t, db, 2, t0)
	if v := a.e.View(); !v.Held || v.Epoch != 1 || v.ID != a.e.ID() || v.URL != url(1) {
		t.Fatalf("first replica: %+v, want holding epoch 1", v)
	}
	if v := b.e.View(); v.Held || v.ID != a.e.ID() || v.URL != url(1) || v.Epoch != 1 {
		t.Fatalf("second replica: %+v, want a's record", v)
	}
	advance(t, 20*time.Second, a, b)
	if v := a.e.View(); !v.Held || v.Epoch != 1 {
		t.Fatalf("renewing owner after 20 s: %+v", v)
	}
	if v := b.e.View(); v.Held || v.ID != a.e.ID() {
		t.Fatalf("b took over a renewing owner: %+v", v)
	}

	// a stalls (its clock stops, as in a long pause): b takes over once the
	// record has stood still for TTL by b's clock, not before.
	changed := b.e.Changed()
	advance(t, ttl-renew, b)
	if v := b.e.View(); v.Held {
		t.Fatalf("b took over %v after a's last renewal: %+v", ttl-renew, v)
	}
	advance(t, 2*renew, b)
	if v := b.e.View(); !v.Held || v.Epoch != 2 {
		t.Fatalf("b after a stood still for TTL: %+v, want holding epoch 2", v)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by the takeover")
	}
	// a still believes it owns, but its epoch is fenced off.
	if v := a.e.View(); !v.Held {
		t.Fatal("a noticed without its clock moving; the test needs it to believe")
	}
	if !fenced(t, db, a, 1) || fenced(t, db, b, 2) {
		t.Fatal("fence: a's epoch 1 must fail, b's epoch 2 pass")
	}
	advance(t, renew, a)
	if v := a.e.View(); v.Held || v.ID != b.e.ID() || v.URL != url(2) {
		t.Fatalf("a after waking: %+v, want b's record", v)
	}
	// a's own belief ends TTL after its last renewal even if it cannot
	// read the store: View needs no storage.
}

// TestClockSkewDoesNotMoveTheHandOver: replicas whose wall clocks disagree by
// an hour still hand over only after the record stood still for TTL: no
// replica compares its time with another's.
func TestClockSkewDoesNotMoveTheHandOver(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	ahead := start(t, db, 2, t0.Add(time.Hour))
	behind := start(t, db, 3, t0.Add(-time.Hour))
	advance(t, 10*time.Second, a, ahead, behind)
	for _, r := range []*replica{ahead, behind} {
		if v := r.e.View(); v.Held || v.ID != a.e.ID() {
			t.Fatalf("skewed replica %s: %+v, want a's record", r.e.cfg.URL, v)
		}
	}
	// a stalls: the replica behind takes over as soon as the one ahead would.
	advance(t, ttl+renew, ahead, behind)
	va, vb := ahead.e.View(), behind.e.View()
	if va.Held == vb.Held || va.Epoch != 2 || vb.Epoch != 2 {
		t.Fatalf("after a stalled: ahead %+v, behind %+v; want exactly one holding epoch 2", va, vb)
	}
}

func TestStopHandsOver(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	b := start(t, db, 2, t0)
	a.e.Stop()
	if v := a.e.View(); v.Held {
		t.Fatalf("stopped elector still holds: %+v", v)
	}
	advance(t, renew, b)
	if v := b.e.View(); !v.Held || v.Epoch != 2 {
		t.Fatalf("b one renewal after a released: %+v, want holding epoch 2", v)
	}
}

// TestSameURLDoesNotTakeOver: two processes configured alike (a restarted
// member whose predecessor is not dead yet, or a name given twice by
// mistake) are two candidates: the second waits like any other, and the
// first keeps its epoch.
func TestSameURLDoesNotTakeOver(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	twin := start(t, db, 1, t0)
	advance(t, 3*ttl, a, twin)
	if v := a.e.View(); !v.Held || v.Epoch != 1 {
		t.Fatalf("first: %+v, want holding epoch 1", v)
	}
	if v := twin.e.View(); v.Held || v.ID != a.e.ID() {
		t.Fatalf("twin: %+v, want the first's record", v)
	}
}

// TestUnknownResultsTakeOneEpoch: every commit is reported as unknown and
// retried on top of itself; a takeover still takes exactly the next epoch.
func TestUnknownResultsTakeOneEpoch(t *testing.T) {
	db := faulty.Wrap(testdb.Open(t), faulty.Options{Seed: 1, CommitUnknownProbability: 1})
	a := start(t, db, 1, t0)
	b := start(t, db, 2, t0)
	advance(t, 3*renew, a, b)
	if v := a.e.View(); !v.Held || v.Epoch != 1 {
		t.Fatalf("a: %+v, want epoch 1", v)
	}
	a.e.Stop()
	advance(t, renew, b)
	if v := b.e.View(); !v.Held || v.Epoch != 2 {
		t.Fatalf("b: %+v, want epoch 2", v)
	}
	if db.Stats.Unknowns.Load() == 0 {
		t.Fatal("no unknown results injected")
	}
}

// TestLegacyLeaseOwnerRecord: the record an earlier version kept for lease
// expiry alone (id, epoch, held-until) is an owner while it changes; once
// it stands still it is taken over with the next epoch, so lease promotion
// stamps keep increasing across the upgrade.
func TestLegacyLeaseOwnerRecord(t *testing.T) {
	db := testdb.Open(t)
	legacy := func(until int64) {
		v := binary.BigEndian.AppendUint64(nil, 77)
		v = binary.BigEndian.AppendUint64(v, 7)
		v = binary.BigEndian.AppendUint64(v, uint64(until))
		if err := db.Update(context.Background(), func(tx storage.Tx) error { tx.Set(key, v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	legacy(1)
	r := start(t, db, 1, t0)
	for i := int64(2); i < 10; i++ {
		legacy(i)
		advance(t, renew, r)
		if v := r.e.View(); v.Held || v.ID != 77 || v.Epoch != 7 {
			t.Fatalf("with a renewing legacy owner: %+v", v)
		}
	}
	advance(t, ttl+renew, r)
	if v := r.e.View(); !v.Held || v.Epoch != 8 {
		t.Fatalf("after the legacy owner stood still: %+v, want holding epoch 8", v)
	}
}

// TestPausedOwnerKeepsItsEpoch: an owner whose own record stood still for
// longer than TTL (it paused, and nobody took over) renews the same epoch
// rather than taking over from itself.
func TestPausedOwnerKeepsItsEpoch(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	a.clk.Advance(3 * ttl)
	a.clk.BlockUntil(t, 1)
	if v := a.e.View(); !v.Held || v.Epoch != 1 {
		t.Fatalf("after a pause of 3 TTL: %+v, want holding epoch 1", v)
	}
}

// TestRefreshReadsTheRecordNow: a replica asked to look again (its owner
// unreachable) reads the record within RenewInterval/refreshGap of its last
// read, not at its next RenewInterval, and so learns of a takeover early.
func TestRefreshReadsTheRecordNow(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, 1, t0)
	b := start(t, db, 2, t0)
	c := start(t, db, 3, t0)
	// a stalls; b takes over. c's clock stands still: only a read it is
	// asked for can tell it.
	advance(t, ttl+renew, b)
	if v := b.e.View(); !v.Held {
		t.Fatalf("b after a stood still for TTL: %+v, want holding", v)
	}
	if v := c.e.View(); v.ID != a.e.ID() {
		t.Fatalf("c before a refresh: %+v, want a's record still", v)
	}
	changed := c.e.Changed()
	c.e.Refresh()
	c.clk.BlockUntil(t, 1) // the gap since its last read
	c.clk.Advance(renew / refreshGap)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("Refresh did not read the record")
	}
	c.clk.BlockUntil(t, 1)
	if v := c.e.View(); v.Held || v.ID != b.e.ID() || v.URL != url(2) {
		t.Fatalf("c after a refresh: %+v, want b's record", v)
	}
}
