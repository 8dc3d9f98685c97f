package mvcc_test

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// TestTailServesWhatStorageHolds: the revisions a store committed are read
// back from memory — no storage transaction — exactly as storage holds
// them, for every kind of read: with and without previous values, keys
// only, in budgets of one revision. The workload puts, overwrites, deletes
// ranges and runs Txns from several clients, with a tail small enough that
// older revisions leave it (they are then read from storage, also equal).
func TestTailServesWhatStorageHolds(t *testing.T) {
	db := openPebble(t)
	s := openStore(t, db, mvcc.Config{LogTailBytes: 64 << 10})
	plain := openStore(t, db, mvcc.Config{LogTailBytes: -1}) // storage only
	ctx := context.Background()
	first, err := s.Put(ctx, &pb.PutRequest{Key: []byte("w/start"), Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(c)))
			for i := range 60 {
				if err := tailWorkloadOp(ctx, s, rnd, c, i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	head, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reads := []mvcc.WatchRead{{}, {PrevKV: true}, {KeysOnly: true}, {PrevKV: true, MaxBytes: 1}}
	fromMemory := 0
	for _, r := range reads {
		for from := first.Header.Revision; from <= head; {
			r.From = from
			got, err := s.ReadWatchEvents(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if got.Reads == 0 {
				fromMemory++
			}
			r.UpTo = got.To
			want, err := plain.ReadWatchEvents(ctx, r)
			r.UpTo = 0
			if err != nil {
				t.Fatal(err)
			}
			if got.To < from || want.To != got.To || len(got.Revs) != len(want.Revs) {
				t.Fatalf("read %+v: to %d with %d revisions, storage to %d with %d", r, got.To, len(got.Revs), want.To, len(want.Revs))
			}
			for i := range got.Revs {
				sameEvents(t, r, got.Revs[i], want.Revs[i])
			}
			from = got.To + 1
		}
	}
	if fromMemory == 0 {
		t.Fatal("no read was answered from memory")
	}
}

// tailWorkloadOp is client c's i-th request of the tail's workload.
func tailWorkloadOp(ctx context.Context, s *mvcc.Store, rnd *rand.Rand, c, i int) error {
	key := func() []byte { return fmt.Appendf(nil, "w/%d", rnd.Intn(12)) }
	val := make([]byte, rnd.Intn(3000))
	rnd.Read(val)
	var err error
	switch rnd.Intn(6) {
	case 0, 1:
		_, err = s.Put(ctx, &pb.PutRequest{Key: key(), Value: val})
	case 2:
		_, err = s.Put(ctx, &pb.PutRequest{Key: key(), Value: val, PrevKv: true})
	case 3:
		k := key()
		_, err = s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k, RangeEnd: append(k, 0xff), PrevKv: i%2 == 0})
	default:
		a, b := key(), key()
		if string(a) == string(b) {
			b = fmt.Appendf(nil, "w/other/%d", c)
		}
		_, err = s.Txn(ctx, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: a, Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 0}}},
			Success: []*pb.RequestOp{
				{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: a, Value: val}}},
				{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: b}}},
			},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: a, Value: val}}}},
		})
	}
	return err
}

func sameEvents(t *testing.T, r mvcc.WatchRead, got, want mvcc.RevisionEvents) {
	t.Helper()
	if got.Rev != want.Rev || len(got.Events) != len(want.Events) {
		t.Fatalf("read %+v: revision %d with %d events, storage %d with %d", r, got.Rev, len(got.Events), want.Rev, len(want.Events))
	}
	for j := range got.Events {
		if !proto.Equal(got.Events[j], want.Events[j]) {
			t.Fatalf("read %+v, revision %d: event %v, storage %v", r, got.Rev, got.Events[j], want.Events[j])
		}
	}
}

// TestTailStopsAtAnotherWritersRevision: a revision another store committed
// is not in this store's tail: a read from memory (no storage transaction:
// EventBatch.Reads) stops before it, and it is read from storage.
func TestTailStopsAtAnotherWritersRevision(t *testing.T) {
	db := openPebble(t)
	a := openStore(t, db, mvcc.Config{})
	b := openStore(t, db, mvcc.Config{})
	ctx := context.Background()
	var revs []int64
	for i, s := range []*mvcc.Store{a, b, a} {
		r, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Header.Revision)
	}
	got, err := a.ReadWatchEvents(ctx, mvcc.WatchRead{From: revs[0], PrevKV: true})
	if err != nil || got.To != revs[0] || got.Reads != 0 {
		t.Fatalf("from %d: to %d, %v; want %d from memory", revs[0], got.To, err, revs[0])
	}
	got, err = a.ReadWatchEvents(ctx, mvcc.WatchRead{From: revs[1], PrevKV: true})
	if err != nil || got.To != revs[2] || got.Reads == 0 {
		t.Fatalf("from %d: to %d, %v; want %d from storage", revs[1], got.To, err, revs[2])
	}
}

// TestFromStorageReadsStorage: a read from the tail reports as its head
// only what the tail knows of; FromStorage reads storage, whose head
// includes another store's later commit (a progress answer must carry it).
func TestFromStorageReadsStorage(t *testing.T) {
	db := openPebble(t)
	a := openStore(t, db, mvcc.Config{})
	b := openStore(t, db, mvcc.Config{})
	ctx := context.Background()
	own, err := a.Put(ctx, &pb.PutRequest{Key: []byte("a"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.Put(ctx, &pb.PutRequest{Key: []byte("b"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	r := mvcc.WatchRead{From: own.Header.Revision, KeysOnly: true}
	if got, err := a.ReadWatchEvents(ctx, r); err != nil || got.Reads != 0 || got.Head != own.Header.Revision {
		t.Fatalf("from the tail: head %d after %d reads, %v; want %d from memory", got.Head, got.Reads, err, own.Header.Revision)
	}
	r.FromStorage = true
	if got, err := a.ReadWatchEvents(ctx, r); err != nil || got.Reads == 0 || got.Head != other.Header.Revision {
		t.Fatalf("fresh: head %d after %d reads, %v; want %d", got.Head, got.Reads, err, other.Header.Revision)
	}
}

// TestTailHoldsNoReplayedBatch: a batch whose commit was reported unknown
// and found landed by its retry is answered from a replay; its revision is
// not taken into the tail (the run that landed may have evaluated
// differently from the one that found it), so a watch read goes to storage.
func TestTailHoldsNoReplayedBatch(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		t.Run(fmt.Sprintf("unknown=%v", unknown), func(t *testing.T) {
			f := faulty.Wrap(openPebble(t), faulty.Options{})
			s := openStore(t, f, mvcc.Config{})
			ctx := context.Background()
			if unknown {
				f.SetOptions(faulty.Options{CommitUnknownProbability: 1})
			}
			r, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
			f.SetOptions(faulty.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if unknown && f.Stats.Unknowns.Load() == 0 {
				t.Fatal("no commit_unknown_result injected")
			}
			b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: r.Header.Revision})
			if err != nil || len(b.Revs) != 1 || b.Revs[0].Events[0].Type != mvccpb.PUT {
				t.Fatalf("read: %+v, %v", b, err)
			}
			if fromStorage := b.Reads > 0; fromStorage != unknown {
				t.Fatalf("read from storage %v, want %v", fromStorage, unknown)
			}
		})
	}
}

// TestWaitRevSeesOwnCommitsWithoutReading: WaitRev returns a revision this
// store committed without a storage transaction: at once, or when the
// commit comes while it waits — within OwnCommitGrace without even a
// storage watch, after it from a watch set up without reading the head
// first. It still sees another store's commits.
func TestWaitRevSeesOwnCommitsWithoutReading(t *testing.T) {
	for _, grace := range []time.Duration{time.Minute, -1} {
		t.Run(fmt.Sprintf("grace=%v", grace), func(t *testing.T) {
			db := openPebble(t)
			m := &callerViews{DB: db}
			a := openStore(t, m, mvcc.Config{OwnCommitGrace: grace})
			b := openStore(t, db, mvcc.Config{})
			ctx := context.Background()
			wctx := context.WithValue(ctx, waiterKey{}, true) // the calls counted
			r, err := a.Put(ctx, &pb.PutRequest{Key: []byte("a"), Value: []byte("v")})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := a.WaitRev(wctx, r.Header.Revision-1, nil); err != nil || got != r.Header.Revision || m.views.Load() != 0 {
				t.Fatalf("WaitRev = %d, %v; want %d without a read", got, err, r.Header.Revision)
			}
			woken := make(chan int64, 1)
			go func() {
				got, err := a.WaitRev(wctx, r.Header.Revision, nil)
				if err != nil {
					t.Error(err)
				}
				woken <- got
			}()
			wantWatches := int64(0)
			if grace < 0 {
				wantWatches = 1
				for m.watches.Load() == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			time.Sleep(20 * time.Millisecond)
			own, err := a.Put(ctx, &pb.PutRequest{Key: []byte("a"), Value: []byte("w")})
			if err != nil {
				t.Fatal(err)
			}
			if got := <-woken; got != own.Header.Revision || m.views.Load() != 0 || m.watches.Load() != wantWatches {
				t.Fatalf("WaitRev past %d = %d after %d reads and %d watches; want %d after 0 and %d",
					r.Header.Revision, got, m.views.Load(), m.watches.Load(), own.Header.Revision, wantWatches)
			}
			if grace > 0 {
				return // another store's commit is seen once the grace is over
			}
			done := make(chan int64, 1)
			go func() {
				got, err := a.WaitRev(ctx, own.Header.Revision, nil)
				if err != nil {
					t.Error(err)
				}
				done <- got
			}()
			other, err := b.Put(ctx, &pb.PutRequest{Key: []byte("b"), Value: []byte("v")})
			if err != nil {
				t.Fatal(err)
			}
			if got := <-done; got != other.Header.Revision {
				t.Fatalf("WaitRev past %d = %d, want %d (another store's)", own.Header.Revision, got, other.Header.Revision)
			}
		})
	}
}

type waiterKey struct{}

// callerViews counts the Views and WaitChanges whose context carries
// waiterKey: the waiter's, not the store's background work.
type callerViews struct {
	storage.DB
	views, watches atomic.Int64
}

func (c *callerViews) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if ctx.Value(waiterKey{}) != nil {
		c.views.Add(1)
	}
	return c.DB.View(ctx, fn)
}

func (c *callerViews) WaitChange(ctx context.Context, key, seen []byte) error {
	if ctx.Value(waiterKey{}) != nil {
		c.watches.Add(1)
	}
	return c.DB.WaitChange(ctx, key, seen)
}

// TestTailServesNothingCompacted: after a compaction the tail serves no
// revision at or below it; storage answers ErrCompacted as before.
func TestTailServesNothingCompacted(t *testing.T) {
	s := openStore(t, openPebble(t), mvcc.Config{})
	ctx := context.Background()
	var revs []int64
	for i := range 3 {
		r, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: fmt.Appendf(nil, "v%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Header.Revision)
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: revs[1]}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: revs[0]}); err != mvcc.ErrCompacted {
		t.Fatalf("read below the compaction: %v, want ErrCompacted", err)
	}
	b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: revs[2], PrevKV: true})
	if err != nil || len(b.Revs) != 1 || string(b.Revs[0].Events[0].PrevKv.GetValue()) != "v1" {
		t.Fatalf("read above the compaction: %+v, %v", b, err)
	}
}

// TestTailKnowsPreviousValuesOlderThanItself: an update that does not read
// its previous value (kube-apiserver's: a Txn comparing the mod revision,
// then a Put), and a delete, of a key whose last write already left the
// tail, are still read back from memory with the previous value, as
// storage holds it; without the values kept (PrevValueBytes < 0) they are
// read from storage.
func TestTailKnowsPreviousValuesOlderThanItself(t *testing.T) {
	for _, c := range []struct {
		name       string
		valueBytes int
		fromMemory bool
	}{{"values kept", 0, true}, {"no values kept", -1, false}} {
		t.Run(c.name, func(t *testing.T) {
			db := openPebble(t)
			s := openStore(t, db, mvcc.Config{LogTailBytes: 16 << 10, PrevValueBytes: c.valueBytes})
			plain := openStore(t, db, mvcc.Config{LogTailBytes: -1})
			ctx := context.Background()
			key := []byte("registry/pods/ns/p")
			put, err := s.Put(ctx, &pb.PutRequest{Key: key, Value: []byte("created")})
			if err != nil {
				t.Fatal(err)
			}
			filler := make([]byte, 1<<10)
			for i := range 64 { // 64 KiB: the put leaves the 16 KiB tail
				if _, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "registry/leases/n%d", i), Value: filler}); err != nil {
					t.Fatal(err)
				}
			}
			upd, err := s.Txn(ctx, &pb.TxnRequest{
				Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
					TargetUnion: &pb.Compare_ModRevision{ModRevision: put.Header.Revision}}},
				Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: []byte("scheduled")}}}},
			})
			if err != nil || !upd.Succeeded {
				t.Fatalf("update: %v, %v", upd, err)
			}
			del, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: key})
			if err != nil {
				t.Fatal(err)
			}
			for rev, prev := range map[int64]string{upd.Header.Revision: "created", del.Header.Revision: "scheduled"} {
				r := mvcc.WatchRead{From: rev, UpTo: rev, PrevKV: true}
				got, err := s.ReadWatchEvents(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if fromMemory := got.Reads == 0; fromMemory != c.fromMemory {
					t.Errorf("revision %d read from memory: %v, want %v", rev, fromMemory, c.fromMemory)
				}
				want, err := plain.ReadWatchEvents(ctx, r)
				if err != nil || len(got.Revs) != 1 || len(want.Revs) != 1 {
					t.Fatalf("revision %d: %d revisions, storage %d (%v)", rev, len(got.Revs), len(want.Revs), err)
				}
				sameEvents(t, r, got.Revs[0], want.Revs[0])
				if v := string(got.Revs[0].Events[0].PrevKv.GetValue()); v != prev {
					t.Errorf("revision %d: previous value %q, want %q", rev, v, prev)
				}
			}
		})
	}
}
