package mvcc_test

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/mvcc/mvcctest"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

func openPebble(t *testing.T) storage.DB {
	t.Helper()
	return testdb.Open(t)
}

func openStore(t *testing.T, db storage.DB, cfg mvcc.Config) *mvcc.Store {
	t.Helper()
	s, err := mvcc.Open(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// op is one randomly generated request.
type op struct {
	req proto.Message
}

func randomOps(seed int64, n int) []op {
	rnd := rand.New(rand.NewSource(seed))
	keys := []string{"a", "a/1", "a/2", "b", "b/x", "c", "c\x00d", "d\xff", "e"}
	key := func() []byte { return []byte(keys[rnd.Intn(len(keys))]) }
	val := func() []byte {
		if rnd.Intn(20) == 0 {
			return make([]byte, 150_000+rnd.Intn(200_000)) // chunked value
		}
		return []byte(fmt.Sprintf("v%d", rnd.Intn(1000)))
	}
	end := func(k []byte) []byte {
		switch rnd.Intn(4) {
		case 0:
			return nil
		case 1:
			return []byte{0}
		case 2:
			return append(append([]byte(nil), k...), 0xff)
		default:
			return key()
		}
	}
	var ops []op
	for i := 0; i < n; i++ {
		switch rnd.Intn(7) {
		case 0, 1:
			ops = append(ops, op{&pb.PutRequest{Key: key(), Value: val(), PrevKv: rnd.Intn(2) == 0}})
		case 2:
			k := key()
			ops = append(ops, op{&pb.DeleteRangeRequest{Key: k, RangeEnd: end(k), PrevKv: rnd.Intn(2) == 0}})
		case 3:
			k := key()
			ops = append(ops, op{&pb.RangeRequest{Key: k, RangeEnd: end(k), Limit: int64(rnd.Intn(3)),
				Revision: int64(rnd.Intn(3) * rnd.Intn(i+1)), SortOrder: pb.RangeRequest_SortOrder(rnd.Intn(3)),
				SortTarget: pb.RangeRequest_SortTarget(rnd.Intn(5)), CountOnly: rnd.Intn(8) == 0, KeysOnly: rnd.Intn(4) == 0}})
		case 4, 5:
			k := key()
			cmp := &pb.Compare{Key: k, Target: pb.Compare_MOD, Result: pb.Compare_CompareResult(rnd.Intn(4)),
				TargetUnion: &pb.Compare_ModRevision{ModRevision: int64(rnd.Intn(i + 2))}}
			put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: val(), PrevKv: true}}}
			get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key(), RangeEnd: []byte{0}}}}
			other := key()
			del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: other, PrevKv: true}}}
			success := []*pb.RequestOp{get, put}
			if string(other) != string(k) {
				success = append(success, del, get)
			}
			ops = append(ops, op{&pb.TxnRequest{Compare: []*pb.Compare{cmp}, Success: success, Failure: []*pb.RequestOp{get}}})
		case 6:
			if i > 10 && rnd.Intn(4) == 0 {
				ops = append(ops, op{&pb.CompactionRequest{Revision: int64(rnd.Intn(i))}})
			} else {
				ops = append(ops, op{&pb.PutRequest{Key: key(), IgnoreValue: rnd.Intn(2) == 0, PrevKv: true}})
			}
		}
	}
	return ops
}

func apply(ctx context.Context, s *mvcc.Store, o op) string {
	var resp proto.Message
	var err error
	switch r := o.req.(type) {
	case *pb.PutRequest:
		resp, err = s.Put(ctx, r)
	case *pb.DeleteRangeRequest:
		resp, err = s.DeleteRange(ctx, r)
	case *pb.RangeRequest:
		resp, err = s.Range(ctx, r)
	case *pb.TxnRequest:
		resp, err = s.Txn(ctx, r)
	case *pb.CompactionRequest:
		resp, err = s.Compact(ctx, r)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return prototext.Format(resp)
}

// TestFaultsDoNotChangeOutcomes runs the same request sequence on a clean
// store and on one whose storage forces retries, reports committed batches as
// "commit unknown result" and fails reads as too old. Every response must be
// identical: no batch applied twice, no Txn outcome misreported.
func TestFaultsDoNotChangeOutcomes(t *testing.T) {
	for seed := int64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			ops := randomOps(seed, 300)
			ctx := context.Background()
			clean := openStore(t, openPebble(t), mvcc.Config{PageKeys: 3})
			fdb := faulty.Wrap(openPebble(t), faulty.Options{Seed: seed, RetryProbability: 0.3,
				CommitUnknownProbability: 0.3, TooOldProbability: 0.05})
			faultyStore := openStore(t, fdb, mvcc.Config{PageKeys: 3})
			for i, o := range ops {
				want := apply(ctx, clean, o)
				got := apply(ctx, faultyStore, o)
				if want != got {
					t.Fatalf("op %d %T %v:\nclean:  %s\nfaulty: %s", i, o.req, prototext.Format(o.req), want, got)
				}
			}
			if fdb.Stats.Unknowns.Load() == 0 || fdb.Stats.Retries.Load() == 0 {
				t.Fatalf("no faults were injected: %+v", &fdb.Stats)
			}
			h1, r1, _, err := clean.HashKV(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			h2, r2, _, err := faultyStore.HashKV(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if h1 != h2 || r1 != r2 {
				t.Fatalf("hash differs: clean %d@%d faulty %d@%d", h1, r1, h2, r2)
			}
		})
	}
}

// TestConcurrentWritesGetDenseRevisions checks group commit: concurrent
// writers under faults each get their own revision, revisions are dense, and
// the revision log holds exactly the acknowledged writes.
func TestConcurrentWritesGetDenseRevisions(t *testing.T) {
	ctx := context.Background()
	fdb := faulty.Wrap(openPebble(t), faulty.Options{Seed: 7, RetryProbability: 0.2, CommitUnknownProbability: 0.2})
	s := openStore(t, fdb, mvcc.Config{})
	const writers, each = 16, 40
	var mu sync.Mutex
	revs := map[int64]string{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				key := fmt.Sprintf("w%02d/%03d", w, i)
				r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(key)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := revs[r.Header.Revision]; dup {
					t.Errorf("revision %d given to %s and %s", r.Header.Revision, prev, key)
				}
				revs[r.Header.Revision] = key
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(revs) != writers*each {
		t.Fatalf("%d revisions for %d writes", len(revs), writers*each)
	}
	sorted := make([]int64, 0, len(revs))
	for r := range revs {
		sorted = append(sorted, r)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	for i, r := range sorted {
		if r != int64(i+2) {
			t.Fatalf("revisions not dense: position %d has %d", i, r)
		}
	}
	evs, head, err := mvcctest.ReadEvents(ctx, s, 2, writers*each+10)
	if err != nil {
		t.Fatal(err)
	}
	if head != int64(writers*each+1) || len(evs) != writers*each {
		t.Fatalf("head %d, %d logged revisions", head, len(evs))
	}
	for _, re := range evs {
		if len(re.Events) != 1 || string(re.Events[0].Kv.Key) != revs[re.Rev] {
			t.Fatalf("log at %d: %v, acknowledged %s", re.Rev, re.Events, revs[re.Rev])
		}
	}
}

// TestLargeValuesAreChunked stores values far above FoundationDB's 100 KB
// value limit through the limit-enforcing wrapper.
func TestLargeValuesAreChunked(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, faulty.Wrap(openPebble(t), faulty.Options{}), mvcc.Config{})
	val := make([]byte, 1_400_000)
	for i := range val {
		val[i] = byte(i * 7)
	}
	if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("big"), Value: val}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("big")})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != string(val) {
		t.Fatalf("large value did not round-trip")
	}
}

// TestLongRangeIsPaged reads a range far larger than one read transaction may
// scan, while writes continue, at a fixed revision.
func TestLongRangeIsPaged(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, faulty.Wrap(openPebble(t), faulty.Options{}), mvcc.Config{PageKeys: 50})
	for i := 0; i < 500; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k%04d", i)), Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Header.Revision
	for i := 0; i < 100; i++ {
		if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(fmt.Sprintf("k%04d", i*3))}); err != nil {
			t.Fatal(err)
		}
	}
	r, err = s.Range(ctx, &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Revision: rev})
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 500 || len(r.Kvs) != 500 {
		t.Fatalf("at fixed revision: count %d kvs %d", r.Count, len(r.Kvs))
	}
	r, err = s.Range(ctx, &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), CountOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 400 {
		t.Fatalf("current count %d, want 400", r.Count)
	}
}
