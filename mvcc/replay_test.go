package mvcc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// slipDB sits under the faulty wrapper and intervenes around sequencer
// batches (transactions that write a batch marker): it can hold one batch
// before its commit until released, and run slip before the Update call
// that follows the commit of the batch that writes key target — which,
// with faulty injecting commit_unknown_result, is that batch's retry.
type slipDB struct {
	storage.DB
	mu      sync.Mutex
	hold    chan struct{} // the next batch waits for it to close
	reached chan struct{} // closed when that batch waits
	target  []byte        // the etcd key whose batch slip follows
	due     bool
	slip    func()
}

func (d *slipDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	d.mu.Lock()
	slip := d.due
	d.due = false
	d.mu.Unlock()
	if slip {
		d.slip()
	}
	batch, hit := false, false
	err := d.DB.Update(ctx, func(tx storage.Tx) error {
		d.mu.Lock()
		target := d.target
		d.mu.Unlock()
		mt := &markerTx{Tx: tx, target: keyspace.Latest(target)}
		if err := fn(mt); err != nil {
			return err
		}
		batch, hit = mt.marker, mt.hit
		if batch {
			d.mu.Lock()
			hold, reached := d.hold, d.reached
			d.hold = nil
			d.mu.Unlock()
			if hold != nil {
				close(reached)
				<-hold
			}
		}
		return nil
	})
	d.mu.Lock()
	if err == nil && hit && d.target != nil {
		d.target, d.due = nil, true
	}
	d.mu.Unlock()
	return err
}

type markerTx struct {
	storage.Tx
	target      []byte
	marker, hit bool
}

func (t *markerTx) Set(k, v []byte) {
	if len(k) > 0 && k[0] == keyspace.Batch(0, 0)[0] {
		t.marker = true
	}
	if bytes.Equal(k, t.target) {
		t.hit = true
	}
	t.Tx.Set(k, v)
}

// TestReplayAfterCompactionSlippedIn: a batch of a Txn with a Range at an
// explicit revision and a Put on a lease commits, is reported as
// commit_unknown_result, and before its retry another writer compacts past
// that revision. The retry finds the batch landed and replays it: every
// answer must be the committed one — the Txn succeeded with the old value,
// the Put took the next revision — not ErrCompacted for the Txn and, one
// revision off, ErrLeaseNotFound for the Put. (The Put may also land in a
// batch of its own, before or after; the scenario repeats until both share
// one, and every answer is checked every time.)
func TestReplayAfterCompactionSlippedIn(t *testing.T) {
	ctx := context.Background()
	raw := testdb.Open(t)
	slip := &slipDB{DB: raw}
	fdb := faulty.Wrap(slip, faulty.Options{Seed: 1})
	s := openInternal(t, fdb, Config{})
	other := openInternal(t, raw, Config{}) // another writer on the same storage
	if err := raw.Update(ctx, func(tx storage.Tx) error {
		tx.Set(keyspace.Lease(7), []byte("lease"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for try := 0; try < 20; try++ {
		if sameBatch := replayScenario(t, s, other, slip, fdb, try); sameBatch {
			return
		}
	}
	t.Fatal("the Txn and the Put never formed one batch")
}

// replayScenario runs the scenario once and reports whether the Txn and the
// Put were committed in one batch (the case the test needs).
func replayScenario(t *testing.T, s, other *Store, slip *slipDB, fdb *faulty.DB, try int) bool {
	ctx := context.Background()
	k := []byte(fmt.Sprintf("k%d", try))
	if _, err := s.Put(ctx, &pb.PutRequest{Key: k, Value: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	base, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hold, reached := make(chan struct{}), make(chan struct{})
	slip.mu.Lock()
	slip.hold, slip.reached = hold, reached
	slip.mu.Unlock()
	first := make(chan error, 1)
	go func() { // takes revision base+1 and holds the lead meanwhile
		_, err := s.Put(ctx, &pb.PutRequest{Key: k, Value: []byte("new")})
		first <- err
	}()
	<-reached
	txn := &pb.TxnRequest{Success: []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: k, Revision: base}}},
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(fmt.Sprintf("x%d", try)), Value: []byte("x")}}},
	}}
	put := &pb.PutRequest{Key: []byte(fmt.Sprintf("y%d", try)), Value: []byte("y"), Lease: 7}
	var txnResp *pb.TxnResponse
	var putResp *pb.PutResponse
	var txnErr, putErr error
	var wg sync.WaitGroup
	queued := make(chan struct{}, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		queued <- struct{}{}
		txnResp, txnErr = s.Txn(ctx, txn)
	}()
	go func() {
		defer wg.Done()
		queued <- struct{}{}
		putResp, putErr = s.Put(ctx, put)
	}()
	<-queued
	<-queued
	slip.mu.Lock()
	slip.target = []byte(fmt.Sprintf("x%d", try)) // the Txn's batch
	slip.slip = func() {
		// Past the Txn's explicit revision, before the batch's retry.
		if _, err := other.Compact(ctx, &pb.CompactionRequest{Revision: base + 1}); err != nil {
			t.Errorf("slipped compaction: %v", err)
		}
	}
	slip.mu.Unlock()
	fdb.SetOptions(faulty.Options{Seed: 1, CommitUnknownProbability: 1})
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	fdb.SetOptions(faulty.Options{Seed: 1})
	if txnErr != nil || putErr != nil {
		t.Fatalf("committed requests answered: txn %v, put %v", txnErr, putErr)
	}
	rng := txnResp.Responses[0].GetResponseRange()
	if !txnResp.Succeeded || len(rng.Kvs) != 1 || string(rng.Kvs[0].Value) != "old" {
		t.Fatalf("txn answered %v", txnResp)
	}
	tr, pr := txnResp.Header.Revision, putResp.Header.Revision
	if tr == pr || tr < base+2 || pr < base+2 {
		t.Fatalf("txn at %d, put at %d, base %d", tr, pr, base)
	}
	for _, c := range []struct {
		rev int64
		key string
	}{{tr, fmt.Sprintf("x%d", try)}, {pr, fmt.Sprintf("y%d", try)}} {
		if e := logAt(t, s, c.rev); len(e.Events) != 1 || string(e.Events[0].Key) != c.key {
			t.Fatalf("revision %d logs %v, answered as %s", c.rev, e.Events, c.key)
		}
	}
	return logAt(t, s, tr).ID.Seq == logAt(t, s, pr).ID.Seq
}

func logAt(t *testing.T, s *Store, rev int64) logEntry {
	t.Helper()
	var e logEntry
	err := s.db.View(context.Background(), func(tx storage.ReadTx) error {
		parts, err := tx.GetRange(keyspace.LogFrom(rev), keyspace.LogFrom(rev+1), storage.RangeOptions{})
		if err != nil {
			return err
		}
		vals := make([][]byte, len(parts))
		for i, p := range parts {
			vals[i] = p.Value
		}
		e, err = decodeLog(vals)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func openInternal(t *testing.T, db storage.DB, cfg Config) *Store {
	t.Helper()
	s, err := Open(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestPhysicalCompactionWaitsOutReplays: on storage other processes may
// write, physical compaction does not reach below the base of a batch that
// may still be replayed — a marker seen for less than the replay window —
// and otherwise goes as far as requested at once; with SoleWriter, once
// this store's own batches are decided.
func TestPhysicalCompactionWaitsOutReplays(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(time.Unix(1000, 0))
	db := testdb.Open(t)
	s := openInternal(t, db, Config{Now: clock.Now})
	other := openInternal(t, db, Config{Now: clock.Now})
	// The other writer's last batch evaluated on revision 1; it could still
	// be replaying it, for all the compactor knows.
	if _, err := other.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{9}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: 5}); err != nil {
		t.Fatal(err)
	}
	seen := newHoldersSeen()
	window := s.cfg.Sequencer.ReplayWindow()
	target, later, err := s.compactTarget(ctx, seen)
	if err != nil || target != 1 || later != window {
		t.Fatalf("right after the request: target %d, wait %v (%v), want 1 (the other writer's base) and %v", target, later, err, window)
	}
	clock.Advance(window - time.Millisecond)
	if target, later, err = s.compactTarget(ctx, seen); err != nil || target != 1 || later != time.Millisecond {
		t.Fatalf("just before the window passed: target %d, wait %v (%v)", target, later, err)
	}
	clock.Advance(time.Millisecond)
	if target, later, err = s.compactTarget(ctx, seen); err != nil || target != 5 || later != 0 {
		t.Fatalf("once the window passed: target %d, wait %v (%v), want 5 and 0", target, later, err)
	}
	if n := historyVersions(t, s, "k"); n != 5 {
		t.Fatalf("%d versions of k before physical compaction, want 5", n)
	}
	if !s.compactTo(ctx, target) {
		t.Fatal("store closed")
	}
	if n := historyVersions(t, s, "k"); n != 2 { // revisions 5 and 6
		t.Fatalf("%d versions of k after physical compaction to 5, want 2", n)
	}
	// The expired marker is gone, and this writer's newest batch (the
	// compaction request's) is at the head: a new compaction goes through.
	if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{7}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: 7}); err != nil {
		t.Fatal(err)
	}
	if target, later, err = s.compactTarget(ctx, seen); err != nil || target != 7 || later != 0 {
		t.Fatalf("with no batch below it: target %d, wait %v (%v), want 7 and 0", target, later, err)
	}

	sole := openInternal(t, testdb.Open(t), Config{Now: clock.Now, SoleWriter: true})
	for i := 0; i < 5; i++ {
		if _, err := sole.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// With SoleWriter nothing waits for the window: Physical returns once
	// the history is gone.
	if _, err := sole.Compact(ctx, &pb.CompactionRequest{Revision: 5, Physical: true}); err != nil {
		t.Fatal(err)
	}
	if n := historyVersions(t, sole, "k"); n != 2 {
		t.Fatalf("%d versions of k after physical compaction to 5, want 2", n)
	}
}

// TestPhysicalCompactionRightAfterWrites: etcdctl compact --physical right
// after writes, on storage other processes could write, returns within
// etcdctl's 5 s command timeout: the compactor has no replay to wait for.
// (It used to wait out the whole replay window, 6 s.)
func TestPhysicalCompactionRightAfterWrites(t *testing.T) {
	s := openInternal(t, testdb.Open(t), Config{})
	for i := 0; i < 20; i++ {
		if _, err := s.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: 15, Physical: true}); err != nil {
		t.Fatalf("physical compaction right after writes: %v", err)
	}
	if n := historyVersions(t, s, "k"); n != 7 { // revisions 15 to 21
		t.Fatalf("%d versions of k after physical compaction to 15, want 7", n)
	}
}

func historyVersions(t *testing.T, s *Store, key string) int {
	t.Helper()
	var n int
	err := s.db.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(keyspace.HistoryPrefix([]byte(key)), storage.Strinc(keyspace.HistoryPrefix([]byte(key))), storage.RangeOptions{})
		n = len(kvs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
