package mvcc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/opcount"
)

// A range's values come from range reads over its keys' history: one pass
// on a store that scans in place, runs of its keys read at once elsewhere
// (opcount's transactions, like FoundationDB's, do not scan in place). Keys
// with many retained versions between the wanted ones push some of them
// past a read's row bound, to point reads. Every value must be the one live
// at the revision read, whatever the order the response sorts in.
func TestRangeValuesAcrossRetainedVersions(t *testing.T) {
	t.Run("backend", func(t *testing.T) { testRangeValuesAcrossRetainedVersions(t, testdb.Open(t)) })
	t.Run("runs", func(t *testing.T) { testRangeValuesAcrossRetainedVersions(t, opcount.Wrap(testdb.Open(t))) })
}

func testRangeValuesAcrossRetainedVersions(t *testing.T, db storage.DB) {
	ctx := context.Background()
	s := openInternal(t, db, Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	const keys = 120
	// live[rev][key] is the value of key at rev, as a model.
	live := map[int64]map[string]string{}
	cur := map[string]string{}
	var revs []int64
	put := func(k, v string) {
		r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
		if err != nil {
			t.Fatal(err)
		}
		cur[k] = v
		snap := make(map[string]string, len(cur))
		for k, v := range cur {
			snap[k] = v
		}
		live[r.Header.Revision] = snap
		revs = append(revs, r.Header.Revision)
	}
	for i := range keys {
		put(fmt.Sprintf("v/%03d", i), "first")
	}
	for round := range 6 {
		for i := range keys {
			// Some keys get many versions, most get none or one.
			if n := rng.IntN(10); n < 3 || i%17 == 0 {
				put(fmt.Sprintf("v/%03d", i), fmt.Sprintf("round %d", round))
			}
		}
	}
	orders := []func() *pb.RangeRequest{
		func() *pb.RangeRequest { return &pb.RangeRequest{} },
		func() *pb.RangeRequest {
			return &pb.RangeRequest{SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_MOD}
		},
		func() *pb.RangeRequest {
			return &pb.RangeRequest{SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_VALUE}
		},
		func() *pb.RangeRequest { return &pb.RangeRequest{Limit: 70} },
	}
	for _, rev := range []int64{revs[keys-1], revs[len(revs)/3], revs[len(revs)/2], revs[len(revs)-1], 0} {
		want := live[rev]
		if rev == 0 {
			want = cur
		}
		for _, o := range orders {
			req := o()
			req.Key, req.RangeEnd, req.Revision = []byte("v/"), []byte("v0"), rev
			resp, err := s.Range(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if req.Limit == 0 && len(resp.Kvs) != len(want) {
				t.Fatalf("rev %d %v: %d keys, want %d", rev, req, len(resp.Kvs), len(want))
			}
			for _, kv := range resp.Kvs {
				if got := string(kv.Value); got != want[string(kv.Key)] {
					t.Fatalf("rev %d %v: %s = %q, want %q", rev, req, kv.Key, got, want[string(kv.Key)])
				}
			}
		}
	}
}

// A single-key Range at the head takes the key's value from the newest
// version its history holds, read with the head — unless that version is
// not the live one: during a staged delete the history already holds the
// tombstones of a revision not yet published, and readers of the head must
// still get the value it deletes.
func TestSingleKeyRangeDuringStagedDelete(t *testing.T) {
	const n = 600
	ctx := context.Background()
	probe := &commitProbe{DB: testdb.Open(t)}
	s := openInternal(t, probe, Config{StageBytes: 4 << 10, StageChunkBytes: 8 << 10})
	fill(t, s, "c/", n, 0)
	key := fmt.Sprintf("c/%07d", n-1)
	filled, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var checks atomic.Int64 // the staging writer and its beat both commit
	probe.mu.Lock()
	probe.after = func() {
		r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(key)})
		if err != nil {
			t.Errorf("range during the staged delete: %v", err)
			return
		}
		// Until the delete is published the key is live at the head,
		// however far its staging (a tombstone above the head) has got.
		live := len(r.Kvs) == 1 && string(r.Kvs[0].Value) == fmt.Sprintf("value-%d", n-1)
		if r.Header.Revision == filled && !live || r.Header.Revision > filled && len(r.Kvs) != 0 {
			t.Errorf("range during the staged delete at %d (filled at %d): %s = %v", r.Header.Revision, filled, key, r.Kvs)
		}
		checks.Add(1)
	}
	probe.mu.Unlock()
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("c/"), RangeEnd: []byte("c0")})
	probe.mu.Lock()
	probe.after = nil
	probe.mu.Unlock()
	if err != nil || d.Deleted != n || !isStaged(t, probe, d.Header.Revision) {
		t.Fatalf("delete %v, %v: not staged", d, err)
	}
	if n := checks.Load(); n < 3 {
		t.Fatalf("%d reads during the staged delete, want several", n)
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(key)})
	if err != nil || len(r.Kvs) != 0 {
		t.Fatalf("after the delete: %v, %v", r.GetKvs(), err)
	}
	if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	if r, err = s.Range(ctx, &pb.RangeRequest{Key: []byte(key)}); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "again" || r.Kvs[0].Version != 1 {
		t.Fatalf("recreated: %v, %v", r.GetKvs(), err)
	}
}

// The first page of a range read at the head comes with the state, in one
// round trip, as many index entries as the page keeps; the rest of the page
// (deleted keys among them, a count the cache does not know, pages smaller
// than the limit) is scanned after them. Every limit, page size and count
// must come out as a plain scan's.
func TestFirstPageReadWithState(t *testing.T) {
	ctx := context.Background()
	for _, pageKeys := range []int{2, 3, 7, 100} {
		s := openInternal(t, testdb.Open(t), Config{PageKeys: pageKeys})
		live := map[string]bool{}
		for i := range 30 {
			k := fmt.Sprintf("p/%02d", i)
			if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte(k)}); err != nil {
				t.Fatal(err)
			}
			live[k] = true
		}
		for i := 0; i < 30; i += 3 { // every third deleted: index tombstones among the rows
			k := fmt.Sprintf("p/%02d", i)
			if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(k)}); err != nil {
				t.Fatal(err)
			}
			delete(live, k)
		}
		var keys []string
		for i := range 30 {
			if k := fmt.Sprintf("p/%02d", i); live[k] {
				keys = append(keys, k)
			}
		}
		for _, limit := range []int64{0, 1, 2, 5, 19, 20, 25} {
			for n, from := range []string{"p/", "p/07", "p/28"} {
				end := fmt.Sprintf("p0%d", n) // a new range each time: no cached count
				r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(from), RangeEnd: []byte(end), Limit: limit})
				if err != nil {
					t.Fatal(err)
				}
				var want []string
				for _, k := range keys {
					if k >= from {
						want = append(want, k)
					}
				}
				more := limit > 0 && int(limit) < len(want)
				count := len(want)
				if more {
					want = want[:limit]
				}
				var got []string
				for _, kv := range r.Kvs {
					if string(kv.Value) != string(kv.Key) {
						t.Fatalf("%s = %q", kv.Key, kv.Value)
					}
					got = append(got, string(kv.Key))
				}
				if fmt.Sprint(got) != fmt.Sprint(want) || r.Count != int64(count) || r.More != more {
					t.Fatalf("pages of %d, [%s, %s) limit %d: %v count %d more %v, want %v count %d more %v",
						pageKeys, from, end, limit, got, r.Count, r.More, want, count, more)
				}
			}
		}
	}
}

// revisionEvents reads one revision's events, with PrevKv, whole.
func revisionEvents(ctx context.Context, s *Store, rev int64) ([]RevisionEvents, error) {
	b, err := s.ReadWatchEvents(ctx, WatchRead{From: rev, UpTo: rev, PrevKV: true})
	return b.Revs, err
}
