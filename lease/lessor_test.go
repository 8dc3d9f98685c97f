package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/mvcc/mvcctest"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
	"github.com/fdb-etcd/fdb-etcd/storage/opcount"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// world is several lessors (fdb-etcd processes) on one store. Each has its
// own fake clock, all advanced together, so that each clock has exactly one
// sleeping loop to wait for and a test can also let one process fall behind.
type world struct {
	t     *testing.T
	db    storage.DB
	wake  *wakeWaits // db, through which the lessors wait for the wake key
	now   time.Time
	nodes []*node
}

// wakeWaits tracks the waits for the wake key in flight. An owner with no
// deadline near waits for the key on a goroutine of its own, which the
// fake clock does not count among the loops it waits for: a grant's change
// of the key wakes it a moment after the grant returns, and time moved
// meanwhile would be time the owner never saw pass. settle waits until
// every such wait has seen the key as it is.
type wakeWaits struct {
	storage.DB
	mu    sync.Mutex
	waits map[*byte][]byte // guarded by mu: each wait in flight, by identity, with the value it waits to change
}

func (d *wakeWaits) WaitChange(ctx context.Context, key, seen []byte) error {
	if !bytes.Equal(key, wakeKey) {
		return d.DB.WaitChange(ctx, key, seen)
	}
	id := new(byte)
	d.mu.Lock()
	d.waits[id] = seen
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.waits, id)
		d.mu.Unlock()
	}()
	return d.DB.WaitChange(ctx, key, seen)
}

// settle waits until no wait for the wake key in flight waits on a value
// the key no longer has, and then a moment for the owner that such a wait
// woke to take the wake-up.
func (d *wakeWaits) settle(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		var cur []byte
		if err := d.DB.View(context.Background(), func(tx storage.ReadTx) error {
			var err error
			cur, err = tx.Get(wakeKey)
			return err
		}); err != nil {
			return // a closed or faulty store: nothing to settle
		}
		d.mu.Lock()
		stale := false
		for _, seen := range d.waits {
			stale = stale || !bytes.Equal(seen, cur)
		}
		d.mu.Unlock()
		if !stale {
			time.Sleep(time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a wait for the wake key did not see its change")
		}
	}
}

type node struct {
	w     *world
	l     *Lessor
	own   *owner.Elector
	db    *crashable // the elector's handle on the store
	store *mvcc.Store
	clk   *fakeclock.Clock
	dead  bool
}

// crashable is a node's elector's view of the store: after a crash its
// writes fail, so that stopping it hands nothing back, as when the process
// dies.
type crashable struct {
	storage.DB
	crashed atomic.Bool
}

var errCrashed = errors.New("test: process crashed")

func (c *crashable) Update(ctx context.Context, fn func(storage.Tx) error) error {
	if c.crashed.Load() {
		return errCrashed
	}
	return c.DB.Update(ctx, fn)
}

// loops is how many loops sleep on a node's clock: the elector's and the
// lessor's.
const loops = 2

var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func openPebble(t *testing.T, dir string) storage.DB {
	t.Helper()
	db, err := pebble.Open(dir, pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func newWorld(t *testing.T, db storage.DB) *world {
	t.Helper()
	if db == nil {
		db = testdb.Open(t)
	}
	wake := &wakeWaits{DB: db, waits: map[*byte][]byte{}}
	w := &world{t: t, db: wake, wake: wake, now: epoch0}
	t.Cleanup(func() {
		for _, n := range w.nodes {
			n.stop()
		}
		_ = db.Close()
	})
	return w
}

func (w *world) cfg(c Config) Config {
	c.Logger = zaptest.NewLogger(w.t, zaptest.Level(zap.WarnLevel))
	return c
}

// add starts a lessor and waits until its loop sleeps.
func (w *world) add(c Config) *node {
	w.t.Helper()
	return w.addSkewed(c, 0)
}

// addSkewed starts a lessor whose clock reads skew ahead of the world's.
func (w *world) addSkewed(c Config, skew time.Duration) *node {
	w.t.Helper()
	store, err := mvcc.Open(w.db, mvcc.Config{})
	if err != nil {
		w.t.Fatal(err)
	}
	n := &node{w: w, store: store, clk: fakeclock.New(w.now.Add(skew)), db: &crashable{DB: w.db}}
	c = w.cfg(c)
	c.Clock = n.clk
	n.own = owner.Start(n.db, owner.Config{TTL: 5 * time.Second, Clock: n.clk, Logger: c.Logger})
	n.l = New(store, n.own, c)
	w.nodes = append(w.nodes, n)
	n.clk.BlockUntil(w.t, loops)
	return n
}

func (n *node) stop() {
	if n.dead {
		return
	}
	n.dead = true
	n.l.Stop()
	n.own.Stop()
	n.store.Close()
}

// crash stops a lessor as if its process died: ownership is not handed back.
func (n *node) crash() {
	n.db.crashed.Store(true)
	n.stop()
}

// advance moves every live clock and waits for every loop to sleep again.
func (w *world) advance(d time.Duration) {
	w.t.Helper()
	w.wake.settle(w.t)
	w.now = w.now.Add(d)
	for _, n := range w.nodes {
		if !n.dead {
			n.clk.Advance(d)
			n.clk.BlockUntil(w.t, loops)
		}
	}
}

// step advances in small steps, so that loops wake at their own deadlines.
func (w *world) step(d, by time.Duration) {
	w.t.Helper()
	for d > 0 {
		s := min(d, by)
		w.advance(s)
		d -= s
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (n *node) put(t *testing.T, key string, id int64) int64 {
	t.Helper()
	r, err := n.store.Put(ctx(t), &pb.PutRequest{Key: []byte(key), Value: []byte("v-" + key), Lease: id})
	if err != nil {
		t.Fatalf("put %s lease %d: %v", key, id, err)
	}
	return r.Header.Revision
}

func (n *node) grant(t *testing.T, id, ttl int64) Granted {
	t.Helper()
	g, err := n.l.Grant(ctx(t), id, ttl)
	if err != nil {
		t.Fatalf("grant %d ttl %d: %v", id, ttl, err)
	}
	return g
}

func (n *node) count(t *testing.T, prefix string) int64 {
	t.Helper()
	r, err := n.store.Range(ctx(t), &pb.RangeRequest{Key: []byte(prefix), RangeEnd: []byte(prefix + "\xff"), CountOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

func (n *node) alive(t *testing.T, id int64) bool {
	t.Helper()
	_, err := n.l.TimeToLive(ctx(t), id, false)
	if errors.Is(err, ErrLeaseNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func (n *node) rev(t *testing.T) int64 {
	t.Helper()
	rev, _, err := n.store.Rev(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// deletes returns, per revision in (from, head], the keys it deleted.
func (n *node) deletes(t *testing.T, from int64) map[int64][]string {
	t.Helper()
	evs, _, err := mvcctest.ReadEvents(ctx(t), n.store, from+1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]string{}
	for _, re := range evs {
		for _, ev := range re.Events {
			if ev.Type != mvccpb.DELETE {
				continue
			}
			if ev.PrevKv == nil || string(ev.PrevKv.Value) != "v-"+string(ev.Kv.Key) {
				t.Errorf("rev %d: DELETE of %q without its prev_kv: %v", re.Rev, ev.Kv.Key, ev.PrevKv)
			}
			out[re.Rev] = append(out[re.Rev], string(ev.Kv.Key))
		}
	}
	return out
}

func indexEntries(t *testing.T, db storage.DB) []indexEntry {
	t.Helper()
	var out []indexEntry
	err := db.View(ctx(t), func(tx storage.ReadTx) error {
		out = nil
		kvs, err := tx.GetRange(indexPrefix, indexEnd, storage.RangeOptions{})
		for _, kv := range kvs {
			d, id, err := parseIndex(kv.Key)
			if err != nil {
				return err
			}
			out = append(out, indexEntry{d, id})
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func storedRecord(t *testing.T, db storage.DB, id int64) (record, bool) {
	t.Helper()
	var v []byte
	err := db.View(ctx(t), func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get(keyspace.Lease(id))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v == nil {
		return record{}, false
	}
	rec, err := decodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	return rec, true
}

func TestGrantSemantics(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{})
	c := ctx(t)

	g := n.grant(t, 100, 60)
	if g.ID != 100 || g.TTL != 60 || g.Revision != 1 {
		t.Fatalf("grant = %+v", g)
	}
	if _, err := n.l.Grant(c, 100, 30); !errors.Is(err, ErrLeaseExists) {
		t.Fatalf("duplicate grant: %v, want ErrLeaseExists", err)
	}
	if _, err := n.l.Grant(c, 101, MaxLeaseTTL+1); !errors.Is(err, ErrLeaseTTLTooLarge) {
		t.Fatalf("huge TTL: %v, want ErrLeaseTTLTooLarge", err)
	}
	if g := n.grant(t, 102, MaxLeaseTTL); g.TTL != MaxLeaseTTL {
		t.Fatalf("max TTL grant = %+v", g)
	}
	for _, ttl := range []int64{1, 0, -5} {
		if g := n.grant(t, 200+ttl, ttl); g.TTL != 2 {
			t.Fatalf("ttl %d granted as %d, want the minimum 2", ttl, g.TTL)
		}
	}
	seen := map[int64]bool{}
	for range 50 {
		g := n.grant(t, 0, 10)
		if g.ID <= 0 || seen[g.ID] {
			t.Fatalf("generated ID %d (seen before: %t)", g.ID, seen[g.ID])
		}
		seen[g.ID] = true
	}
	if g := n.grant(t, -7, 10); g.ID != -7 {
		t.Fatalf("negative ID grant = %+v", g)
	}

	st, err := n.l.TimeToLive(c, 100, true)
	if err != nil || st.TTL != 60 || st.GrantedTTL != 60 || len(st.Keys) != 0 {
		t.Fatalf("TimeToLive = %+v, %v", st, err)
	}
	n.put(t, "b", 100)
	n.put(t, "a", 100)
	st, err = n.l.TimeToLive(c, 100, true)
	if err != nil || len(st.Keys) != 2 || string(st.Keys[0]) != "a" || string(st.Keys[1]) != "b" || st.Revision != 3 {
		t.Fatalf("TimeToLive with keys = %+v, %v", st, err)
	}
	if st, err := n.l.TimeToLive(c, 4242, true); !errors.Is(err, ErrLeaseNotFound) || st.Revision != 3 {
		t.Fatalf("TimeToLive of unknown lease: %+v, %v", st, err)
	}
	if st, _ := n.l.TimeToLive(c, 102, false); st.TTL != MaxLeaseTTL {
		t.Fatalf("TimeToLive of a max-TTL lease = %+v", st)
	}

	// Leases come soonest deadline first, like etcd's.
	w.advance(time.Second)
	n.grant(t, 300, 5)
	ids, rev, err := n.l.Leases(c)
	if err != nil || rev != 3 {
		t.Fatal(err, rev)
	}
	if len(ids) != 1+1+3+50+1+1 {
		t.Fatalf("%d leases", len(ids))
	}
	want := []int64{195, 200, 201, 300}
	for i, id := range want {
		if ids[i] != id {
			t.Fatalf("leases start %v, want %v", ids[:len(want)], want)
		}
	}
	if ids[len(ids)-1] != 102 {
		t.Fatalf("last lease %d, want 102 (max TTL)", ids[len(ids)-1])
	}

	// Revoke deletes the keys in one revision.
	rev, err = n.l.Revoke(c, 100)
	if err != nil || rev != 4 {
		t.Fatalf("revoke: rev %d, %v", rev, err)
	}
	if d := n.deletes(t, 3); len(d) != 1 || len(d[4]) != 2 {
		t.Fatalf("revoke deletes = %v", d)
	}
	if _, err := n.l.Revoke(c, 100); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	if rev, err := n.l.Revoke(c, 300); err != nil || rev != 4 {
		t.Fatalf("revoke without keys: rev %d, %v (no new revision)", rev, err)
	}
	if _, err := n.store.Put(c, &pb.PutRequest{Key: []byte("x"), Lease: 100}); !errors.Is(err, mvcc.ErrLeaseNotFound) {
		t.Fatalf("put with revoked lease: %v", err)
	}
	if _, _, err := n.l.Renew(c, 100); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew of revoked lease: %v", err)
	}
}

func TestExpiryDeletesAllKeysInOneRevision(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{})
	n.grant(t, 1, 10)
	n.grant(t, 2, 20)
	for i := range 5 {
		n.put(t, fmt.Sprintf("k%d", i), 1)
	}
	n.put(t, "other", 2)
	n.put(t, "plain", 0)
	before := n.rev(t)

	w.step(9500*time.Millisecond, 500*time.Millisecond)
	if got := n.count(t, "k"); got != 5 || !n.alive(t, 1) {
		t.Fatalf("lease 1 expired early: %d keys left", got)
	}
	w.step(time.Second, 100*time.Millisecond)
	if got := n.count(t, "k"); got != 0 || n.alive(t, 1) {
		t.Fatalf("lease 1 not expired at its deadline: %d keys left", got)
	}
	d := n.deletes(t, before)
	if len(d) != 1 || len(d[before+1]) != 5 {
		t.Fatalf("expiry deleted %v, want 5 keys in revision %d", d, before+1)
	}
	if n.count(t, "other") != 1 || n.count(t, "plain") != 1 || !n.alive(t, 2) {
		t.Fatal("expiry touched another lease's keys")
	}
	w.step(10*time.Second, time.Second)
	if n.count(t, "other") != 0 || n.alive(t, 2) {
		t.Fatal("lease 2 not expired")
	}
	if es := indexEntries(t, w.db); len(es) != 0 {
		t.Fatalf("index entries left after expiry: %v", es)
	}
}

func TestKeepAlive(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{})
	c := ctx(t)
	n.grant(t, 1, 10)
	n.put(t, "k", 1)

	w.advance(8 * time.Second)
	ttl, rev, err := n.l.Renew(c, 1)
	if err != nil || ttl != 10 || rev != 2 {
		t.Fatalf("renew: ttl %d rev %d %v", ttl, rev, err)
	}
	rec, _ := storedRecord(t, w.db, 1)
	if want := epoch0.Add(18*time.Second + time.Second).UnixMicro(); rec.Deadline != want {
		t.Fatalf("deadline after renew = %v, want now+TTL+slack %v", time.UnixMicro(rec.Deadline), time.UnixMicro(want))
	}
	// Back-to-back renewals are covered by the durable deadline: no write.
	w.advance(500 * time.Millisecond)
	if ttl, _, err := n.l.Renew(c, 1); err != nil || ttl != 10 {
		t.Fatal(ttl, err)
	}
	if rec2, _ := storedRecord(t, w.db, 1); rec2.Deadline != rec.Deadline {
		t.Fatal("a covered renewal wrote the deadline")
	}
	if st, _ := n.l.TimeToLive(c, 1, false); st.TTL != 10 {
		t.Fatalf("TimeToLive after renew = %d, want 10 (capped at the granted TTL)", st.TTL)
	}
	// The lease lives until the renewed deadline, not the granted one.
	w.step(10*time.Second, 500*time.Millisecond) // now 18.5 s
	if !n.alive(t, 1) || n.count(t, "k") != 1 {
		t.Fatal("renewed lease expired at its old deadline")
	}
	w.step(time.Second, 100*time.Millisecond) // 19.5 s > 8+10+1
	if n.alive(t, 1) || n.count(t, "k") != 0 {
		t.Fatal("renewed lease not expired at its new deadline")
	}
	if _, _, err := n.l.Renew(c, 1); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew after expiry: %v", err)
	}
	if _, _, err := n.l.Renew(c, 99); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("renew of unknown lease: %v", err)
	}
}

func TestRenewSlackIsCappedForShortLeases(t *testing.T) {
	w := newWorld(t, nil)
	n := w.add(Config{})
	n.grant(t, 1, 2)
	w.advance(time.Second)
	if _, _, err := n.l.Renew(ctx(t), 1); err != nil {
		t.Fatal(err)
	}
	rec, _ := storedRecord(t, w.db, 1)
	if want := epoch0.Add(3*time.Second + 500*time.Millisecond).UnixMicro(); rec.Deadline != want {
		t.Fatalf("deadline %v, want now+2s+TTL/4", time.UnixMicro(rec.Deadline))
	}
}

// TestRestartKeepsRemainingTTL: a lease's deadline survives a restart; the
// new process extends it by Extend (etcd's Promote) instead of resetting it
// to the full TTL (kine #581).
func TestRestartKeepsRemainingTTL(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%t", crash), func(t *testing.T) {
			dir := t.TempDir()
			db := openPebble(t, dir)
			wake := &wakeWaits{DB: db, waits: map[*byte][]byte{}}
			w := &world{t: t, db: wake, wake: wake, now: epoch0}
			n := w.add(Config{})
			n.grant(t, 1, 100)
			n.grant(t, 2, 62)
			n.put(t, "k", 1)
			n.put(t, "j", 2)
			w.step(60*time.Second, 5*time.Second)
			if crash {
				n.crash()
			} else {
				n.stop()
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			w2 := newWorld(t, openPebble(t, dir))
			w2.now = w.now
			n2 := w2.add(Config{})
			if crash {
				// The dead owner's record must stand still for the ownership TTL first.
				if own, _ := n2.l.Owner(); own {
					t.Fatal("took over from a crashed owner before its ownership lapsed")
				}
				w2.step(6*time.Second, time.Second)
			}
			if own, epoch := n2.l.Owner(); !own || epoch != 2 {
				t.Fatalf("restarted lessor: owner %t epoch %d, want epoch 2", own, epoch)
			}
			st, err := n2.l.TimeToLive(ctx(t), 1, true)
			if err != nil {
				t.Fatal(err)
			}
			elapsed := w2.now.Sub(epoch0)
			want := int64((100*time.Second + time.Second - elapsed) / time.Second)
			if st.TTL != want && st.TTL != want-1 {
				t.Fatalf("TTL after restart = %d, want %d: remaining plus Extend, not reset to 100", st.TTL, want)
			}
			// Lease 2 was due at 62 s: after a crash (restart at 65 s) it
			// gets Extend from the takeover, never less.
			if crash {
				if !n2.alive(t, 2) {
					t.Fatal("lease 2 expired before its extension")
				}
				w2.step(time.Second, 100*time.Millisecond)
				if n2.alive(t, 2) || n2.count(t, "j") != 0 {
					t.Fatal("lease 2 not expired after its extension")
				}
			} else {
				w2.step(2500*time.Millisecond, 100*time.Millisecond) // 62.5 s: 62 + Extend not reached
				if !n2.alive(t, 2) {
					t.Fatal("lease 2 expired before deadline + Extend")
				}
				w2.step(600*time.Millisecond, 100*time.Millisecond)
				if n2.alive(t, 2) {
					t.Fatal("lease 2 not expired at deadline + Extend")
				}
			}
			// Lease 1: deadline 100 s + Extend.
			w2.step(epoch0.Add(100*time.Second+900*time.Millisecond).Sub(w2.now), time.Second)
			if !n2.alive(t, 1) || n2.count(t, "k") != 1 {
				t.Fatal("lease 1 expired before deadline + Extend")
			}
			w2.step(200*time.Millisecond, 100*time.Millisecond)
			if n2.alive(t, 1) || n2.count(t, "k") != 0 {
				t.Fatal("lease 1 not expired at deadline + Extend")
			}
		})
	}
}

// TestTwoLessorsExpireExactlyOnce runs two processes on one store: grants
// and renewals arrive at both, one of them expires, each lease's keys go in
// exactly one revision.
func TestTwoLessorsExpireExactlyOnce(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	b := w.add(Config{})
	if own, _ := a.l.Owner(); !own {
		t.Fatal("first lessor does not own expiry")
	}
	if own, _ := b.l.Owner(); own {
		t.Fatal("two owners")
	}
	const leases = 20
	for i := int64(1); i <= leases; i++ {
		n := a
		if i%2 == 0 {
			n = b
		}
		n.grant(t, i, 5+i%3)
		for k := range 3 {
			a.put(t, fmt.Sprintf("l%02d/%d", i, k), i)
		}
	}
	before := a.rev(t)
	// Lease 1 is kept alive through the non-owner.
	for range 4 {
		w.advance(2 * time.Second)
		if _, _, err := b.l.Renew(ctx(t), 1); err != nil {
			t.Fatal(err)
		}
	}
	w.step(3*time.Second, 500*time.Millisecond)
	if !a.alive(t, 1) {
		t.Fatal("lease renewed at the non-owner was expired")
	}
	d := a.deletes(t, before)
	if len(d) != leases-1 {
		t.Fatalf("%d expiry revisions, want %d: %v", len(d), leases-1, d)
	}
	for rev, keys := range d {
		if len(keys) != 3 || !strings.HasPrefix(keys[1], keys[0][:3]) || !strings.HasPrefix(keys[2], keys[0][:3]) {
			t.Fatalf("revision %d deleted %v, want one lease's 3 keys", rev, keys)
		}
	}
	// The non-owner cannot expire: its fence fails.
	a.grant(t, 99, 2)
	a.put(t, "x", 99)
	w.advance(3 * time.Second)
	if a.alive(t, 99) {
		t.Fatal("lease 99 not expired")
	}
	b.grant(t, 98, 2)
	b.put(t, "y", 98)
	w.now = w.now.Add(3 * time.Second)
	for _, n := range w.nodes {
		n.clk.Advance(3 * time.Second) // both clocks past the deadline ...
	}
	// ... but let b try first, with whatever epoch it believes in.
	if out := b.l.expire(1, 98, b.clk.Now().UnixMicro()); out != outNotOwner {
		t.Fatalf("non-owner's expiry: outcome %d, want fenced", out)
	}
	for _, n := range w.nodes {
		n.clk.BlockUntil(t, loops)
	}
	if a.alive(t, 98) || a.count(t, "y") != 0 {
		t.Fatal("lease 98 not expired by the owner")
	}
}

// TestFailover: the owner dies; the other process takes over once the
// ownership times out, extends every lease, and expires them.
func TestFailover(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	b := w.add(Config{})
	a.grant(t, 1, 8)
	a.grant(t, 2, 30)
	a.put(t, "one", 1)
	a.put(t, "two", 2)
	w.step(4*time.Second, time.Second)
	a.crash()

	// a renewed at 4 s at the latest: b may take over from 9 s.
	w.step(4500*time.Millisecond, 500*time.Millisecond) // 8.5 s
	if own, _ := b.l.Owner(); own {
		t.Fatal("b took over while a's ownership was still valid")
	}
	if !b.alive(t, 1) {
		t.Fatal("lease 1 expired with no owner")
	}
	w.step(1500*time.Millisecond, 500*time.Millisecond) // 10 s
	own, epoch := b.l.Owner()
	if !own || epoch != 2 {
		t.Fatalf("b: owner %t epoch %d", own, epoch)
	}
	// Lease 1 was due at 8 s, during the failover: the takeover at ~9-10 s
	// gave it Extend (1 s) from then.
	rec, _ := storedRecord(t, w.db, 1)
	if rec.Epoch != 2 || rec.Deadline < epoch0.Add(9*time.Second+time.Second).UnixMicro() {
		t.Fatalf("lease 1 after takeover: %+v (deadline %v)", rec, time.UnixMicro(rec.Deadline))
	}
	if rec2, _ := storedRecord(t, w.db, 2); rec2.Deadline != epoch0.Add(31*time.Second).UnixMicro() {
		t.Fatalf("lease 2 deadline %v, want 30 s + Extend", time.UnixMicro(rec2.Deadline))
	}
	w.step(2*time.Second, 100*time.Millisecond)
	if b.alive(t, 1) || b.count(t, "one") != 0 {
		t.Fatal("lease 1 not expired by the new owner")
	}
	w.step(epoch0.Add(30900*time.Millisecond).Sub(w.now), time.Second)
	if !b.alive(t, 2) {
		t.Fatal("lease 2 expired before 30 s + Extend")
	}
	w.step(200*time.Millisecond, 100*time.Millisecond)
	if b.alive(t, 2) {
		t.Fatal("lease 2 not expired")
	}
}

// TestDeposedOwnerIsFenced: the owner stalls (its clock stops, as in a long
// pause); another process takes over; the stalled one cannot delete.
func TestDeposedOwnerIsFenced(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	b := w.add(Config{})
	a.grant(t, 1, 10)
	a.put(t, "k", 1)
	_, epochA := a.l.Owner()

	// Only b's clock moves: a does not renew.
	b.clk.Advance(7 * time.Second)
	b.clk.BlockUntil(t, loops)
	if own, epoch := b.l.Owner(); !own || epoch != epochA+1 {
		t.Fatalf("b did not take over: %t %d", own, epoch)
	}
	if own, _ := a.l.Owner(); !own {
		t.Fatal("a noticed too early; the test needs it to believe it owns")
	}
	// a wakes past the deadline, believing it owns expiry: it is fenced.
	if out := a.l.expire(epochA, 1, epoch0.Add(20*time.Second).UnixMicro()); out != outNotOwner {
		t.Fatalf("deposed owner's expiry: outcome %d", out)
	}
	if a.count(t, "k") != 1 {
		t.Fatal("deposed owner deleted")
	}
	a.clk.Advance(7 * time.Second)
	a.clk.BlockUntil(t, loops)
	if own, _ := a.l.Owner(); own {
		t.Fatal("a still believes it owns expiry")
	}
	// b extended lease 1 on takeover: due at 10 s + 1 s.
	b.clk.Advance(3900 * time.Millisecond)
	b.clk.BlockUntil(t, loops)
	if !b.alive(t, 1) {
		t.Fatal("expired before deadline + Extend")
	}
	b.clk.Advance(200 * time.Millisecond)
	b.clk.BlockUntil(t, loops)
	if b.alive(t, 1) || b.count(t, "k") != 0 {
		t.Fatal("new owner did not expire")
	}
}

// TestExpiryRacesRenewal: a renewal that commits before the expiry's
// transaction keeps the lease; the fence re-reads the deadline.
func TestExpiryRacesRenewal(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	a.grant(t, 1, 5)
	a.put(t, "k", 1)
	_, epoch := a.l.Owner()
	w.advance(4 * time.Second)
	if _, _, err := a.l.Renew(ctx(t), 1); err != nil {
		t.Fatal(err)
	}
	// An expiry decided on the stale deadline (5 s) is refused.
	if out := a.l.expire(epoch, 1, epoch0.Add(5*time.Second).UnixMicro()); out != outRenewed {
		t.Fatalf("outcome %d, want renewed", out)
	}
	if a.count(t, "k") != 1 {
		t.Fatal("renewed lease's key deleted")
	}
}

// TestStaleIndexEntriesAreCleared: a user revoke leaves the deadline entry
// behind; the owner clears it when it comes due, and a re-granted lease
// with the same ID is not expired by the old entry.
func TestStaleIndexEntriesAreCleared(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	a.grant(t, 1, 5)
	if _, err := a.l.Revoke(ctx(t), 1); err != nil {
		t.Fatal(err)
	}
	a.grant(t, 2, 5)
	w.advance(time.Second)
	a.grant(t, 1, 30) // same ID again
	a.put(t, "k", 1)
	if es := indexEntries(t, w.db); len(es) != 3 {
		t.Fatalf("index = %v", es)
	}
	w.step(5*time.Second, 500*time.Millisecond)
	if !a.alive(t, 1) || a.count(t, "k") != 1 {
		t.Fatal("re-granted lease expired by its predecessor's deadline")
	}
	es := indexEntries(t, w.db)
	if len(es) != 1 || es[0].id != 1 {
		t.Fatalf("index after cleanup = %v", es)
	}
}

// TestRevokeThousandKeysWithinLimits runs a 1,000-key lease through the
// FoundationDB limits (and injected retries and unknown commit results),
// by revoke and by expiry.
func TestRevokeThousandKeysWithinLimits(t *testing.T) {
	fdb := faulty.Wrap(openPebble(t, t.TempDir()), faulty.Options{Seed: 1, RetryProbability: 0.1, CommitUnknownProbability: 0.1})
	w := newWorld(t, fdb)
	a := w.add(Config{})
	c := ctx(t)
	key := func(l, i int) string {
		return fmt.Sprintf("/registry/events/ns/%d/%s%06d", l, strings.Repeat("e", 150), i)
	}
	val := strings.Repeat("x", 1024)
	for l := 1; l <= 2; l++ {
		a.grant(t, int64(l), 3600)
		for i := 0; i < 1000; i += 100 {
			var ops []*pb.RequestOp
			for j := i; j < i+100; j++ {
				ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
					Key: []byte(key(l, j)), Value: []byte(val), Lease: int64(l)}}})
			}
			if _, err := a.store.Txn(c, &pb.TxnRequest{Success: ops}); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := a.l.TimeToLive(c, 1, true)
	if err != nil || len(st.Keys) != 1000 {
		t.Fatalf("TimeToLive: %d keys, %v", len(st.Keys), err)
	}
	before := a.rev(t)
	if _, err := a.l.Revoke(c, 1); err != nil {
		t.Fatal(err)
	}
	w.step(3601*time.Second, 1200*time.Second)
	w.step(2*time.Second, 500*time.Millisecond)
	evs, _, err := mvcctest.ReadEvents(c, a.store, before+1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || len(evs[0].Events) != 1000 || len(evs[1].Events) != 1000 {
		t.Fatalf("revoke + expiry: %d revisions", len(evs))
	}
	for _, re := range evs {
		for _, ev := range re.Events {
			if ev.Type != mvccpb.DELETE || ev.PrevKv == nil || len(ev.PrevKv.Value) != 1024 {
				t.Fatalf("rev %d: bad event %v", re.Rev, ev)
			}
		}
	}
	if a.alive(t, 2) || a.count(t, "/registry/") != 0 {
		t.Fatal("keys left")
	}
	if n := fdb.Stats.LimitErrors.Load(); n != 0 {
		t.Fatalf("%d storage limit errors", n)
	}
	t.Logf("injected: %d retries, %d unknown results", fdb.Stats.Retries.Load(), fdb.Stats.Unknowns.Load())
}

// TestGrantIdempotentUnderUnknownResults: every commit reports "unknown
// result" and is retried on top of itself; grants must not then report
// their own lease as existing, and renewals must not double anything.
func TestGrantIdempotentUnderUnknownResults(t *testing.T) {
	fdb := faulty.Wrap(openPebble(t, t.TempDir()), faulty.Options{Seed: 2, CommitUnknownProbability: 1})
	w := newWorld(t, fdb)
	a := w.add(Config{})
	for i := int64(1); i <= 20; i++ {
		a.grant(t, i, 10)
	}
	g := a.grant(t, 0, 10)
	ids, _, err := a.l.Leases(ctx(t))
	if err != nil || len(ids) != 21 {
		t.Fatalf("%d leases (%v), want 21", len(ids), err)
	}
	w.advance(5 * time.Second)
	if _, _, err := a.l.Renew(ctx(t), g.ID); err != nil {
		t.Fatal(err)
	}
	rec, _ := storedRecord(t, w.db, g.ID)
	if rec.Deadline != epoch0.Add(16*time.Second).UnixMicro() {
		t.Fatalf("deadline %v", time.UnixMicro(rec.Deadline))
	}
	if es := indexEntries(t, w.db); len(es) != 21 {
		t.Fatalf("%d index entries, want 21", len(es))
	}
	if fdb.Stats.Unknowns.Load() == 0 {
		t.Fatal("no unknown results injected")
	}
}

func TestPromotionPagesAndIdempotence(t *testing.T) {
	fdb := faulty.Wrap(openPebble(t, t.TempDir()), faulty.Options{Seed: 3})
	w := newWorld(t, fdb)
	a := w.add(Config{PromotePage: 7})
	for i := int64(1); i <= 50; i++ {
		a.grant(t, i, 100)
	}
	a.crash()
	fdb.SetOptions(faulty.Options{Seed: 3, CommitUnknownProbability: 0.5, RetryProbability: 0.2})
	w.now = w.now.Add(10 * time.Second)
	b := w.add(Config{PromotePage: 7})
	// b saw a's record at start; it takes over once the record has stood
	// still for the ownership TTL by b's own clock.
	w.step(6*time.Second, time.Second)
	if own, epoch := b.l.Owner(); !own || epoch != 2 {
		t.Fatalf("b owner %t epoch %d", own, epoch)
	}
	for i := int64(1); i <= 50; i++ {
		rec, _ := storedRecord(t, w.db, i)
		if rec.Epoch != 2 || rec.Deadline != epoch0.Add(101*time.Second).UnixMicro() {
			t.Fatalf("lease %d after promotion: epoch %d deadline %v", i, rec.Epoch, time.UnixMicro(rec.Deadline))
		}
	}
	if es := indexEntries(t, w.db); len(es) != 50 {
		t.Fatalf("%d index entries", len(es))
	}
}

func TestStopFailsCalls(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	a.grant(t, 1, 10)
	a.stop()
	c := ctx(t)
	if _, err := a.l.Grant(c, 2, 10); !errors.Is(err, ErrStopped) {
		t.Fatalf("grant after stop: %v", err)
	}
	if _, _, err := a.l.Renew(c, 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("renew after stop: %v", err)
	}
	// Ownership was handed back: the next lessor takes over at once.
	b := w.add(Config{})
	if own, _ := b.l.Owner(); !own {
		t.Fatal("successor did not take over a released ownership")
	}
}

// TestKeepAlivePastDeadlineDoesNotRevive: between a lease's deadline and
// the commit of its revoke, a keep-alive must not extend it (etcd's lessor
// refuses to renew an expired lease): the renewal's transaction refuses the
// due lease, and Renew waits for the revoke, then answers not found.
func TestKeepAlivePastDeadlineDoesNotRevive(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{}) // the owner
	b := w.add(Config{})
	a.grant(t, 1, 2)
	a.put(t, "k", 1)
	// b's clock passes the deadline; the owner's has not reached it, so the
	// lease is due but not revoked (for milliseconds normally, for seconds
	// when many leases come due together).
	b.clk.Advance(3 * time.Second)
	b.clk.BlockUntil(t, loops)
	before, _ := storedRecord(t, w.db, 1)
	if _, err := b.l.submit(ctx(t), &writeReq{id: 1}); !errors.Is(err, errExpired) {
		t.Fatalf("renewal commit of a due lease: %v, want errExpired", err)
	}
	short, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	if _, _, err := b.l.Renew(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("renewal of a due lease = %v; want it to wait for the revoke", err)
	}
	if rec, _ := storedRecord(t, w.db, 1); rec.Deadline != before.Deadline {
		t.Fatalf("a renewal past the deadline moved it to %v", time.UnixMicro(rec.Deadline))
	}
	done := make(chan error, 1)
	c := ctx(t)
	go func() {
		_, _, err := b.l.Renew(c, 1)
		done <- err
	}()
	a.clk.Advance(3 * time.Second)
	a.clk.BlockUntil(t, loops)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseNotFound) {
			t.Fatalf("waiting renewal answered %v after the revoke, want ErrLeaseNotFound", err)
		}
	case <-c.Done():
		t.Fatal("waiting renewal did not return after the revoke")
	}
	if a.count(t, "k") != 0 || a.alive(t, 1) {
		t.Fatal("the due lease survived")
	}
}

// TestKeepAliveWaitingAcrossFailoverRenews: a keep-alive waiting for a due
// lease's revoke when the owner dies is answered once the new owner's
// promotion extends the lease: it renews it, as etcd's client does by
// retrying its keep-alive at the new leader.
func TestKeepAliveWaitingAcrossFailoverRenews(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	b := w.add(Config{})
	a.grant(t, 1, 2)
	a.put(t, "k", 1)
	b.clk.Advance(3 * time.Second)
	b.clk.BlockUntil(t, loops)
	done := make(chan error, 1)
	c := ctx(t)
	go func() {
		_, _, err := b.l.Renew(c, 1)
		done <- err
	}()
	a.crash()
	// a's record, unchanged since b's start, lapses at 5 s by b's clock.
	w.step(2*time.Second, time.Second)
	if own, _ := b.l.Owner(); !own {
		t.Fatal("b did not take over")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("waiting renewal after the takeover: %v", err)
		}
	case <-c.Done():
		t.Fatal("waiting renewal did not return after the takeover's promotion")
	}
	rec, _ := storedRecord(t, w.db, 1)
	if want := b.clk.Now().Add(2 * time.Second).UnixMicro(); rec.Deadline < want {
		t.Fatalf("deadline after the renewal %v, want at least now+TTL %v", time.UnixMicro(rec.Deadline), time.UnixMicro(want))
	}
}

// TestOwnershipIgnoresClockSkew: a process whose wall clock is an hour ahead
// does not take expiry over from a live owner, and leases it renews are
// expired by the owner only.
func TestOwnershipIgnoresClockSkew(t *testing.T) {
	w := newWorld(t, nil)
	a := w.add(Config{})
	ahead := w.addSkewed(Config{}, time.Hour)
	w.step(20*time.Second, time.Second)
	if own, _ := ahead.l.Owner(); own {
		t.Fatal("the process with a clock an hour ahead took expiry over from a live owner")
	}
	if own, epoch := a.l.Owner(); !own || epoch != 1 {
		t.Fatalf("a: owner %t epoch %d, want still epoch 1", own, epoch)
	}
}

// waitQueuedKeepAlives waits until n goroutines wait in a group-commit
// queue for their batch (a select in Queue.Do), as the goroutine dump shows
// them, or 30 s have passed; the test's own count then says what happened.
func waitQueuedKeepAlives(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		dump := string(buf[:runtime.Stack(buf, true)])
		queued := 0
		for _, g := range strings.Split(dump, "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "[select") && strings.Contains(g, "internal/groupcommit.(*Queue[") && strings.Contains(g, "]).Do(") {
				queued++
			}
		}
		if queued >= n {
			return
		}
	}
	t.Logf("fewer than %d keep-alives queued after 30 s", n)
}

// TestKeepAlivesShareOneRead: keep-alives that arrive while a read of
// lease records is in progress share the next one, one transaction for all
// of them, and each gets its own lease's answer.
func TestKeepAlivesShareOneRead(t *testing.T) {
	db := opcount.Wrap(testdb.Open(t))
	w := newWorld(t, db)
	n := w.add(Config{})
	const leases = 16
	for id := int64(1); id <= leases; id++ {
		n.grant(t, id, 10+id)
	}
	// Hold the lead of the read queue, so that the keep-alives queue up.
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = n.l.reads.Do(ctx(t), 0, 0, func(batch []*readWaiter) {
			close(held)
			<-release
			for _, w := range batch {
				w.Answer(recordRead{}, nil)
			}
		})
	}()
	<-held
	type answer struct {
		id, ttl int64
		err     error
	}
	answers := make(chan answer, leases+1)
	var started sync.WaitGroup
	for id := int64(1); id <= leases+1; id++ { // and one lease never granted
		started.Add(1)
		go func() {
			started.Done()
			ttl, _, err := n.l.Renew(ctx(t), id)
			answers <- answer{id, ttl, err}
		}()
	}
	started.Wait()
	// Started is not queued: on a loaded machine a keep-alive may reach
	// the queue only after the lead is released, and share a later read.
	waitQueuedKeepAlives(t, leases+1)
	db.Reset()
	close(release)
	for range leases + 1 {
		a := <-answers
		switch {
		case a.id > leases && !errors.Is(a.err, ErrLeaseNotFound):
			t.Errorf("keep-alive of unknown lease %d: ttl %d, %v", a.id, a.ttl, a.err)
		case a.id <= leases && (a.err != nil || a.ttl != 10+a.id):
			t.Errorf("keep-alive of lease %d: ttl %d, %v; want %d", a.id, a.ttl, a.err, 10+a.id)
		}
	}
	// Those that queued while the lead was held share one transaction;
	// a straggler still on its way then shares the next.
	if c := db.Reset(); c.Attempts > leases/4 || c.Commits != 0 {
		t.Fatalf("%d keep-alives took %v, want at most %d read-only transactions", leases+1, c, leases/4)
	}
}

// indexReads counts the reads of the deadline index from its start made
// through it (n, one per expiry pass), the waits started (waits) and
// those that saw their key change (woke).
type indexReads struct {
	storage.DB
	n, waits, woke atomic.Int64
}

func (d *indexReads) WaitChange(ctx context.Context, key, seen []byte) error {
	d.waits.Add(1)
	err := d.DB.WaitChange(ctx, key, seen)
	if err == nil {
		d.woke.Add(1)
	}
	return err
}

// awaitWake waits until a wait through d has seen its key change since it
// counted from woke: the owner's wait runs on a goroutine of its own,
// which the fake clock does not count among the loops it waits for.
func (d *indexReads) awaitWake(t *testing.T, from int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); d.woke.Load() <= from; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the quiet owner was not woken by the grant")
		}
	}
}

// expiresOnTime is expiresOnTime for a quiet owner, which the grant must
// wake before time moves on.
func (d *indexReads) expiresOnTime(t *testing.T, w *world, granter, owner *node) {
	t.Helper()
	woke := d.woke.Load()
	expiresOnTime(t, granter, owner, func(total, by time.Duration) {
		d.awaitWake(t, woke)
		w.step(total, by)
	})
}

func (d *indexReads) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return d.DB.View(ctx, func(tx storage.ReadTx) error { return fn(indexReadTx{tx, &d.n}) })
}

// indexReadTx hides the Batcher capability, so that storage.ReadBatch
// reads through GetRange and is counted.
type indexReadTx struct {
	storage.ReadTx
	n *atomic.Int64
}

func (tx indexReadTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if string(begin) == string(indexPrefix) {
		tx.n.Add(1)
	}
	return tx.ReadTx.GetRange(begin, end, opt)
}

// TestQuietOwnerWaitsForNewLeases: with no lease due soon the owner reads
// the deadline index only at QuietScanInterval, and a lease granted in the
// meantime (here at another process) still expires on time, because its
// grant wakes the owner.
func TestQuietOwnerWaitsForNewLeases(t *testing.T) {
	db := &indexReads{DB: testdb.Open(t)}
	w := newWorld(t, db)
	cfg := Config{QuietScanInterval: 30 * time.Second}
	a := w.add(cfg)
	b := w.add(cfg)
	if own, _ := a.l.Owner(); !own {
		t.Fatal("first lessor does not own expiry")
	}
	w.step(2*time.Second, 100*time.Millisecond)
	before := db.n.Load()
	w.step(9*time.Second, 100*time.Millisecond)
	if n := db.n.Load() - before; n > 0 {
		t.Fatalf("the owner read the deadline index %d times in 9 s without leases", n)
	}
	db.expiresOnTime(t, w, b, a)
}

// TestQuietOwnerKeepsItsWait: a quiet owner reads the deadline index at
// every QuietScanInterval, and keeps waiting for the wake key on the wait
// it started first rather than starting one per read (on FoundationDB a
// transaction and a watch registration each); a grant still wakes it.
func TestQuietOwnerKeepsItsWait(t *testing.T) {
	db := &indexReads{DB: testdb.Open(t)}
	w := newWorld(t, db)
	a := w.add(Config{QuietScanInterval: 5 * time.Second})
	w.step(32*time.Second, 100*time.Millisecond)
	if n := db.n.Load(); n < 6 {
		t.Fatalf("the quiet owner read the deadline index %d times in 32 s, want one per 5 s", n)
	}
	if n := db.waits.Load(); n != 1 {
		t.Fatalf("the quiet owner started %d waits for the wake key in 32 s, want 1 kept throughout", n)
	}
	db.expiresOnTime(t, w, a, a)
}

// TestQuietReadsOnWholeScanIntervals: a quiet owner's reads of the
// deadline index fall on whole multiples of ScanInterval on its clock, so
// that those of a process's tenants start together and share a read
// version, wherever the owner's first pass fell.
func TestQuietReadsOnWholeScanIntervals(t *testing.T) {
	db := &indexReads{DB: testdb.Open(t)}
	w := newWorld(t, db)
	w.now = w.now.Add(350 * time.Millisecond) // off the grid
	w.add(Config{QuietScanInterval: 5 * time.Second})
	w.step(2*time.Second, 50*time.Millisecond)
	var at []time.Duration // the quiet reads' times after epoch0
	for range 600 {        // 30 s
		n := db.n.Load()
		w.advance(50 * time.Millisecond)
		if db.n.Load() != n {
			at = append(at, w.now.Sub(epoch0))
		}
	}
	if len(at) < 5 {
		t.Fatalf("the quiet owner read the deadline index at %v in 30 s, want one per 5 s", at)
	}
	for _, d := range at {
		if d%time.Second != 0 {
			t.Fatalf("the quiet owner read the deadline index at %v after the epoch, want whole seconds (ScanInterval): all %v", d, at)
		}
	}
}

// expiresOnTime grants a 2 s lease with a key at granter, steps time with
// step, and checks that owner expires it within 3 s.
func expiresOnTime(t *testing.T, granter, owner *node, step func(total, by time.Duration)) {
	t.Helper()
	granter.grant(t, 1, 2)
	granter.put(t, "k", 1)
	step(3*time.Second, 100*time.Millisecond)
	if owner.alive(t, 1) || owner.count(t, "k") != 0 {
		t.Fatal("a lease granted while the owner was quiet did not expire at its deadline")
	}
}

// TestGrantsWakeQuietOwnerOncePerScan: grants in quick succession wake a
// quiet owner, which then reads the index once per ScanInterval, not once
// per grant.
func TestGrantsWakeQuietOwnerOncePerScan(t *testing.T) {
	db := &indexReads{DB: testdb.Open(t)}
	w := newWorld(t, db)
	a := w.add(Config{QuietScanInterval: 30 * time.Second})
	w.step(2*time.Second, 100*time.Millisecond)
	before := db.n.Load()
	const grants = 20
	for id := int64(1); id <= grants; id++ {
		a.grant(t, id, 60)
		// Time for the owner to wake and read, if it would: without it
		// the grants could all come before the first wake.
		time.Sleep(10 * time.Millisecond)
		w.advance(50 * time.Millisecond) // 1 s in all
	}
	w.step(time.Second, 100*time.Millisecond)
	if n := db.n.Load() - before; n > 2 {
		t.Fatalf("%d grants over 2 s made the owner read the deadline index %d times, want at most 2", grants, n)
	}
}

// noWatch is a store whose WaitChange always fails, as FoundationDB's does
// past its limit on watches.
type noWatch struct {
	*indexReads
	calls atomic.Int64
}

func (d *noWatch) WaitChange(context.Context, []byte, []byte) error {
	d.calls.Add(1)
	return errors.New("test: too many watches")
}

// step advances the world by total in steps of by, letting the owner's
// wait fail after each: it runs on a goroutine of its own, which the fake
// clock does not count among the loops it waits for. A pass without a
// lease near reads the index once and then waits once; one with a lease
// near does not wait, so the wait for the wait is bounded.
func (d *noWatch) step(w *world, total, by time.Duration) {
	for ; total > 0; total -= by {
		w.advance(by)
		for deadline := time.Now().Add(20 * time.Millisecond); d.calls.Load() < d.n.Load() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Millisecond) // for the failed wait to reach the loop
	}
}

// TestQuietOwnerWithoutWatches: when the wake key cannot be watched the
// owner reads the index every ScanInterval, as without the key, neither
// more often nor too late for a new lease.
func TestQuietOwnerWithoutWatches(t *testing.T) {
	db := &noWatch{indexReads: &indexReads{DB: testdb.Open(t)}}
	w := newWorld(t, db)
	a := w.add(Config{QuietScanInterval: 30 * time.Second})
	db.step(w, 2*time.Second, 100*time.Millisecond)
	before := db.n.Load()
	db.step(w, 5*time.Second, 100*time.Millisecond)
	if n := db.n.Load() - before; n < 3 || n > 6 {
		t.Fatalf("the owner read the deadline index %d times in 5 s without watches, want about 5", n)
	}
	expiresOnTime(t, a, a, func(total, by time.Duration) { db.step(w, total, by) })
}
