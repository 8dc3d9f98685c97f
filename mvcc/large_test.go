package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// fill puts n keys prefix/%07d (every third on lease, if lease != 0) in
// Txns of 500 puts.
func fill(t testing.TB, s *Store, prefix string, n int, lease int64) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 500 {
		var ops []*pb.RequestOp
		for j := i; j < min(n, i+500); j++ {
			p := &pb.PutRequest{Key: []byte(fmt.Sprintf("%s%07d", prefix, j)), Value: []byte(fmt.Sprintf("value-%d", j))}
			if lease != 0 && j%3 == 0 {
				p.Lease = lease
			}
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: p}})
		}
		if _, err := s.Txn(ctx, &pb.TxnRequest{Success: ops}); err != nil {
			t.Fatal(err)
		}
	}
}

func grantLease(t testing.TB, db storage.DB, id int64) {
	t.Helper()
	if err := db.Update(context.Background(), func(tx storage.Tx) error {
		tx.Set(keyspace.Lease(id), []byte("lease"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// largeOps is a history with a large DeleteRange and a large revoke among
// ordinary writes: the same on every store it runs on.
func largeOps(t *testing.T, s *Store, db storage.DB, n int) []string {
	ctx := context.Background()
	var out []string
	note := func(what string, rev int64, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out = append(out, fmt.Sprintf("%s @%d", what, rev))
	}
	grantLease(t, db, 7)
	grantLease(t, db, 8)
	fill(t, s, "del/", n, 8)
	fill(t, s, "keep/", 10, 0)
	fill(t, s, "lease/", n, 7)
	// Keys the lease held once: moved to another lease, or deleted.
	for _, k := range []string{"lease/0000000", "lease/0000003"} {
		r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte("moved"), Lease: 8})
		note("move "+k, r.GetHeader().GetRevision(), err)
	}
	r, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("lease/0000006")})
	note("delete one", r.GetHeader().GetRevision(), err)

	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("del/"), RangeEnd: []byte("del0")})
	note(fmt.Sprintf("delete range: %d deleted", d.GetDeleted()), d.GetHeader().GetRevision(), err)
	v, err := s.Revoke(ctx, &RevokeRequest{ID: 7})
	note("revoke 7", v.GetHeader().GetRevision(), err)
	v, err = s.Revoke(ctx, &RevokeRequest{ID: 7})
	out = append(out, fmt.Sprintf("revoke 7 again: %v", err))
	d, err = s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("del/"), RangeEnd: []byte("del0")})
	note(fmt.Sprintf("delete range again: %d deleted", d.GetDeleted()), d.GetHeader().GetRevision(), err)
	p, err := s.Put(ctx, &pb.PutRequest{Key: []byte("del/0000001"), Value: []byte("back"), PrevKv: true})
	note(fmt.Sprintf("put back, prev %v", p.GetPrevKv()), p.GetHeader().GetRevision(), err)
	return out
}

// TestLargeWritesMatchBatchedOnes: a DeleteRange and a lease revoke large
// enough to be staged, under FoundationDB's limits with injected conflicts
// and commit_unknown_result at every step, answer and store exactly what the
// same requests do through ordinary batches on a store without limits:
// responses, the revision log, the hash of the history, the leases'
// attachments.
func TestLargeWritesMatchBatchedOnes(t *testing.T) {
	const n = 6_000
	plain := testdb.Open(t)
	ref := openInternal(t, plain, Config{StageBytes: 1 << 30, SoleWriter: true, Sequencer: revision.Config{BatchBytes: 64 << 20}})
	want := largeOps(t, ref, plain, n)

	raw := testdb.Open(t)
	fdb := faulty.Wrap(raw, faulty.Options{Seed: 5, RetryProbability: 0.1, CommitUnknownProbability: 0.3})
	s := openInternal(t, fdb, Config{StageBytes: 16 << 10, SoleWriter: true})
	got := largeOps(t, s, fdb, n)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("staged:\n%v\nbatched:\n%v", got, want)
	}
	if fdb.Stats.Unknowns.Load() == 0 || fdb.Stats.LimitErrors.Load() != 0 {
		t.Fatalf("faults: %d unknown results (want some), %d limit errors (want none)", fdb.Stats.Unknowns.Load(), fdb.Stats.LimitErrors.Load())
	}
	sameStores(t, ref, s)
	head, _, err := s.Rev(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The delete range and the revoke: the revisions before the final put
	// and the second delete range (which found nothing).
	for _, rev := range []int64{head - 2, head - 1} {
		if !isStaged(t, s.db, rev) || isStaged(t, ref.db, rev) {
			t.Fatalf("revision %d: staged %v, in the reference %v; want only the former", rev, isStaged(t, s.db, rev), isStaged(t, ref.db, rev))
		}
	}
}

// isStaged reports whether revision rev was written by a staged request:
// its first log part holds no events.
func isStaged(t *testing.T, db storage.DB, rev int64) bool {
	t.Helper()
	var first []byte
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		var err error
		first, err = tx.Get(keyspace.Log(rev, 0))
		return err
	})
	if err != nil || first == nil {
		t.Fatalf("revision %d: log %v", rev, err)
	}
	e, err := decodeLog([][]byte{first})
	if err != nil {
		t.Fatal(err)
	}
	return len(e.Events) == 0
}

// sameStores compares two stores' revision logs, hashes and attachments.
func sameStores(t *testing.T, a, b *Store) {
	t.Helper()
	ctx := context.Background()
	ha, ra, _, err := a.HashKV(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	hb, rb, _, err := b.HashKV(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ha != hb || ra != rb {
		t.Fatalf("hash %d@%d, want %d@%d", hb, rb, ha, ra)
	}
	for rev := int64(2); rev <= ra; rev++ {
		ea, err := revisionEvents(ctx, a, rev)
		if err != nil {
			t.Fatal(err)
		}
		eb, err := revisionEvents(ctx, b, rev)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(ea) != fmt.Sprint(eb) {
			t.Fatalf("revision %d: %d events, want %d", rev, len(eb[0].Events), len(ea[0].Events))
		}
	}
	if x, y := attachments(t, a.db), attachments(t, b.db); x != y {
		t.Fatalf("attachments differ:\n%s\nwant\n%s", y, x)
	}
	consistent(t, b.db)
}

// consistent checks the on-disk invariants (checkStoreConsistent). It reads
// the whole store in one transaction, which FoundationDB's 5 s limit does
// not allow at these sizes, so it runs on Pebble only.
func consistent(t *testing.T, db storage.DB) {
	t.Helper()
	if testdb.Backend() != "pebble" {
		return
	}
	if _, _, err := checkStoreConsistent(db); err != nil {
		t.Fatal(err)
	}
}

func attachments(t *testing.T, db storage.DB) string {
	t.Helper()
	var b bytes.Buffer
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(keyspace.AttachPrefix(0)[:1], []byte{keyspace.AttachPrefix(0)[0] + 1}, storage.RangeOptions{})
		for _, kv := range kvs {
			fmt.Fprintf(&b, "%x\n", kv.Key)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestLargeDeleteUnderLoad: while a staged DeleteRange of many keys is
// written, other clients keep writing and reading. Every read sees the
// range whole or gone, consistently with its header revision; every write
// gets its own revision, dense with the delete's; the watch log holds the
// delete's events at one revision.
func TestLargeDeleteUnderLoad(t *testing.T) {
	const n = 20_000
	ctx := context.Background()
	raw := testdb.Open(t)
	fdb := faulty.Wrap(raw, faulty.Options{Seed: 9, RetryProbability: 0.05, CommitUnknownProbability: 0.05})
	s := openInternal(t, fdb, Config{StageBytes: 64 << 10, SoleWriter: true})
	fill(t, s, "big/", n, 0)
	base, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	revs := map[int64]string{}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := fmt.Sprintf("other/%d/%d", w, i)
				r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte("v")})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				revs[r.Header.Revision] = k
				mu.Unlock()
			}
		}()
	}
	var reads atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), CountOnly: true})
			if err != nil {
				t.Error(err)
				return
			}
			if r.Count != 0 && r.Count != n {
				t.Errorf("count %d at revision %d: a partial delete", r.Count, r.Header.Revision)
				return
			}
			reads.Add(1)
		}
	}()
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0")})
	stop.Store(true)
	wg.Wait()
	if err != nil || d.Deleted != n {
		t.Fatalf("delete: %v, %v", d, err)
	}
	revs[d.Header.Revision] = "delete"
	for r := base + 1; r < base+1+int64(len(revs)); r++ {
		if _, ok := revs[r]; !ok {
			t.Fatalf("revision %d missing among %d writes after %d", r, len(revs), base)
		}
	}
	evs, err := revisionEvents(ctx, s, d.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || len(evs[0].Events) != n {
		t.Fatalf("%d revisions read, want the delete's %d events", len(evs), n)
	}
	for i, ev := range evs[0].Events {
		if ev.Type != mvccpb.DELETE || string(ev.Kv.Key) != fmt.Sprintf("big/%07d", i) || ev.PrevKv == nil {
			t.Fatalf("event %d: %v", i, ev)
		}
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), Revision: d.Header.Revision - 1, CountOnly: true})
	if err != nil || r.Count != n {
		t.Fatalf("count before the delete: %v, %v", r, err)
	}
	consistent(t, raw)
	t.Logf("%d other writes and %d counts during the delete", len(revs)-1, reads.Load())
}

// TestDeleteBehindDeletedKeysIsStaged: the size check of a DeleteRange
// reads past index entries of keys deleted earlier (tombstones until
// compaction), which cost nothing to delete again, to the live keys behind
// them.
func TestDeleteBehindDeletedKeysIsStaged(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t)
	s := openInternal(t, db, Config{StageBytes: 16 << 10, SoleWriter: true})
	fill(t, s, "z/", 6000, 0)
	for i := 0; i < 5000; i += 100 {
		end := []byte(fmt.Sprintf("z/%07d", i+100))
		if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(fmt.Sprintf("z/%07d", i)), RangeEnd: end}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("z/"), RangeEnd: []byte("z0")})
	if err != nil || d.Deleted != 1000 {
		t.Fatalf("delete: %v, %v", d, err)
	}
	if !isStaged(t, db, d.Header.Revision) {
		t.Fatal("1,000 keys behind 5,000 deleted ones: not staged")
	}
}

// historyProbe counts the per-key history lookups of its transactions
// (versionAt's reverse reads), not a range's reads of its values.
type historyProbe struct {
	storage.DB
	reads atomic.Int64
}

func (p *historyProbe) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return p.DB.View(ctx, func(tx storage.ReadTx) error { return fn(&historyProbeTx{ReadTx: tx, p: p}) })
}

type historyProbeTx struct {
	storage.ReadTx
	p *historyProbe
}

func (t *historyProbeTx) GetRange(b, e []byte, o storage.RangeOptions) ([]storage.KeyValue, error) {
	if len(b) > 0 && b[0] == keyspace.HistoryPrefix(nil)[0] && o.Reverse {
		t.p.reads.Add(1)
	}
	return t.ReadTx.GetRange(b, e, o)
}

// TestReadsBeforeStagedDeleteSkipHistory: every read during a staged
// delete is a read of the revision before it; the tombstones it staged
// record the versions they delete, so such a read finds each key without a
// history lookup (one per key, 3.7 s for 20,000 keys on FoundationDB before).
func TestReadsBeforeStagedDeleteSkipHistory(t *testing.T) {
	ctx := context.Background()
	probe := &historyProbe{DB: testdb.Open(t)}
	s := openInternal(t, probe, Config{StageBytes: 16 << 10, SoleWriter: true})
	fill(t, s, "r/", 2000, 0)
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("r/"), RangeEnd: []byte("r0")})
	if err != nil || !isStaged(t, probe, d.Header.Revision) {
		t.Fatalf("delete %v, %v: not staged", d, err)
	}
	probe.reads.Store(0)
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("r/"), RangeEnd: []byte("r0"), Revision: d.Header.Revision - 1})
	if err != nil || len(r.Kvs) != 2000 || string(r.Kvs[1999].Value) != "value-1999" {
		t.Fatalf("range before the delete: %d keys, %v", len(r.GetKvs()), err)
	}
	if n := probe.reads.Load(); n != 0 {
		t.Fatalf("%d history lookups reading 2,000 keys at the revision before a staged delete, want 0", n)
	}
}

// TestCompactLargeRevision: physical compaction cleans up a staged revision
// of 60,000 kube-length keys, whose cleanup writes more than one
// transaction may (FoundationDB's limits, enforced), in steps of
// CompactionBatch keys resuming within the revision, and leaves nothing of
// the deleted keys.
func TestCompactLargeRevision(t *testing.T) {
	ctx := context.Background()
	db := faulty.Wrap(testdb.Open(t), faulty.Options{})
	s := openInternal(t, db, Config{SoleWriter: true})
	prefix := "c/" + strings.Repeat("x", 80) + "-"
	fill(t, s, prefix, 60_000, 0)
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("c/"), RangeEnd: []byte("c0")})
	if err != nil || !isStaged(t, db, d.Header.Revision) {
		t.Fatalf("delete %v, %v: not staged", d, err)
	}
	p, err := s.Put(ctx, &pb.PutRequest{Key: []byte("after"), Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := s.Compact(cctx, &pb.CompactionRequest{Revision: p.Header.Revision, Physical: true}); err != nil {
		t.Fatalf("physical compaction: %v", err)
	}
	var left int
	err = db.View(ctx, func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(keyspace.HistoryPrefix([]byte("c/")), keyspace.HistoryPrefix([]byte("c0")), storage.RangeOptions{Limit: 10})
		left = len(kvs)
		if err != nil {
			return err
		}
		lb, le := keyspace.LatestRange([]byte("c/"), []byte("c0"))
		kvs, err = tx.GetRange(lb, le, storage.RangeOptions{Limit: 10})
		left += len(kvs)
		return err
	})
	if err != nil || left != 0 {
		t.Fatalf("history and index entries of the deleted keys left: %d (%v)", left, err)
	}
	if n := db.Stats.LimitErrors.Load(); n != 0 {
		t.Fatalf("%d transactions over FoundationDB's limits", n)
	}
}

// stuckReads fails every read-only transaction with transaction_too_old
// (1007) while stuck is set: a backend on which no read can finish.
type stuckReads struct {
	storage.DB
	stuck atomic.Bool
}

func (s *stuckReads) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return s.DB.View(ctx, func(tx storage.ReadTx) error {
		if s.stuck.Load() {
			return storage.ErrTransactionTooOld
		}
		return fn(tx)
	})
}

// TestStagingReadsAreBounded: staging runs under no deadline as a whole,
// but a read of it that cannot finish retries for CommitTimeout, not
// forever: the DeleteRange fails with ErrTimeout and the head stays; once
// reads work again the next write finishes the staged request.
func TestStagingReadsAreBounded(t *testing.T) {
	ctx := context.Background()
	db := &stuckReads{DB: testdb.Open(t)}
	defer db.stuck.Store(false) // lets a staging that did not give up end
	s := openInternal(t, db, Config{StageBytes: 16 << 10, Sequencer: revision.Config{
		BeatInterval: 50 * time.Millisecond, BeatTimeout: 500 * time.Millisecond}})
	fill(t, s, "b/", 2000, 0)
	head, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db.stuck.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("b/"), RangeEnd: []byte("b0")})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("delete with no read finishing: %v, want ErrTimeout", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a staging read retries without end under context.Background()")
	}
	db.stuck.Store(false)
	if now, _, err := s.Rev(ctx); err != nil || now != head {
		t.Fatalf("head %d, %v after the failed delete; want %d", now, err, head)
	}
	p, err := s.Put(ctx, &pb.PutRequest{Key: []byte("after"), Value: []byte("v")})
	if err != nil || p.Header.Revision != head+2 {
		t.Fatalf("put after the failed delete: %v, %v; want revision %d (the delete finished first)", p, err, head+2)
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("b/"), RangeEnd: []byte("b0"), CountOnly: true})
	if err != nil || r.Count != 0 {
		t.Fatalf("count after: %v, %v; want 0", r, err)
	}
}
