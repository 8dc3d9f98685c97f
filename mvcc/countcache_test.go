package mvcc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// TestPaginatedCounts pages through a range at a fixed revision while the
// range changes after it, as kube-apiserver does: every page must report the
// count etcd would, the live keys of [page start, end) at that revision,
// whether the store counted it or carried it over from the previous page.
func TestPaginatedCounts(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, openPebble(t), mvcc.Config{})
	for i := 0; i < 300; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k/%03d", i)), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k/100"), RangeEnd: []byte("k/150")}); err != nil {
		t.Fatal(err)
	}
	end := []byte("k0")
	for round := 0; round < 2; round++ { // the second round finds every count cached
		key, rev, seen := []byte("k/"), int64(0), 0
		for page := 0; ; page++ {
			resp, err := s.Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: end, Limit: 40, Revision: rev})
			if err != nil {
				t.Fatal(err)
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			want, err := s.Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev, CountOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Count != want.Count || resp.More != (want.Count > int64(len(resp.Kvs))) {
				t.Fatalf("round %d page %d from %q at %d: count %d more %v with %d keys; want count %d",
					round, page, key, rev, resp.Count, resp.More, len(resp.Kvs), want.Count)
			}
			seen += len(resp.Kvs)
			if !resp.More {
				break
			}
			key = append(append([]byte(nil), resp.Kvs[len(resp.Kvs)-1].Key...), 0)
			// Changes after rev must not show in this list.
			if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k/%03d-new-%d", 299-page, round)), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(fmt.Sprintf("k/%03d", 298-page))}); err != nil {
				t.Fatal(err)
			}
		}
		if round == 0 && seen != 250 {
			t.Fatalf("listed %d keys, want 250", seen)
		}
	}
}

// TestCountsFollowWrites counts ranges again and again while keys are
// created, updated, deleted, recreated (alone and in transactions) and
// compacted away: each count, whether caught up from the log or scanned, must
// equal a full scan's.
func TestCountsFollowWrites(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, openPebble(t), mvcc.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	ranges := [][2]string{{"a/", "a0"}, {"a/1", "a/5"}, {"b", "\x00"}, {"", "\x00"}}
	key := func() []byte { return []byte(fmt.Sprintf("%c/%d", "ab"[rng.IntN(2)], rng.IntN(60))) }
	for step := 0; step < 600; step++ {
		switch op := rng.IntN(10); {
		case op < 5:
			if _, err := s.Put(ctx, &pb.PutRequest{Key: key(), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		case op < 7:
			k := key()
			if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k, RangeEnd: append(k, '5')}); err != nil {
				t.Fatal(err)
			}
		case op < 9:
			k1, k2 := key(), key()
			if string(k1) == string(k2) {
				continue
			}
			if _, err := s.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{
				{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k1, Value: []byte("t")}}},
				{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k2}}},
			}}); err != nil {
				t.Fatal(err)
			}
		default:
			head, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("x")})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: head.Header.Revision - int64(rng.IntN(20))}); err != nil && !errors.Is(err, mvcc.ErrCompacted) {
				t.Fatal(err)
			}
		}
		if step%7 != 0 {
			continue
		}
		for _, rg := range ranges {
			got, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(rg[0]), RangeEnd: []byte(rg[1]), CountOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			scan, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(rg[0]), RangeEnd: []byte(rg[1]), KeysOnly: true, Revision: got.Header.Revision})
			if err != nil {
				t.Fatal(err)
			}
			if got.Count != int64(len(scan.Kvs)) || scan.Count != got.Count {
				t.Fatalf("step %d: count of [%q, %q) at %d = %d, scan finds %d keys (count %d)",
					step, rg[0], rg[1], got.Header.Revision, got.Count, len(scan.Kvs), scan.Count)
			}
		}
	}
}

// TestCountsAfterSortedOrFilteredLimits makes limited Ranges whose results are
// not the first keys of the range in key order — sorted by another target or
// descending, or filtered by revision — and then counts every suffix of the
// range: a limited range may leave behind the count of the rest of the range
// only when it returned a key-ordered, unfiltered prefix of it.
func TestCountsAfterSortedOrFilteredLimits(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, openPebble(t), mvcc.Config{})
	keys := []string{"a", "b", "c", "d", "e"}
	for i, k := range keys {
		// Later keys are older, so that create/mod order is the reverse of key order.
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(keys[len(keys)-1-i]), Value: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("c"), Value: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	orders := []pb.RangeRequest_SortOrder{pb.RangeRequest_NONE, pb.RangeRequest_ASCEND, pb.RangeRequest_DESCEND}
	targets := []pb.RangeRequest_SortTarget{pb.RangeRequest_KEY, pb.RangeRequest_VERSION, pb.RangeRequest_CREATE, pb.RangeRequest_MOD, pb.RangeRequest_VALUE}
	filters := []func(*pb.RangeRequest){
		func(*pb.RangeRequest) {},
		func(r *pb.RangeRequest) { r.MinModRevision = 4 },
		func(r *pb.RangeRequest) { r.MaxModRevision = 4 },
		func(r *pb.RangeRequest) { r.MinCreateRevision = 4 },
		func(r *pb.RangeRequest) { r.MaxCreateRevision = 3 },
	}
	for _, order := range orders {
		for _, target := range targets {
			for fi, filter := range filters {
				for limit := int64(1); limit <= 3; limit++ {
					// A write outside the range first, so that this Range's
					// counts are the newest ones the cache has.
					if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("z"), Value: []byte("v")}); err != nil {
						t.Fatal(err)
					}
					r := &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("f"), Limit: limit, SortOrder: order, SortTarget: target}
					filter(r)
					if _, err := s.Range(ctx, r); err != nil {
						t.Fatal(err)
					}
					checkSuffixCounts(t, s, fmt.Sprintf("after %v/%v filter %d limit %d", order, target, fi, limit))
				}
			}
		}
	}
}

// checkSuffixCounts compares the counts of [k, "f") and [k+"\x00", "f") with
// the keys a full scan finds there.
func checkSuffixCounts(t *testing.T, s *mvcc.Store, what string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range []string{"a", "a\x00", "b", "b\x00", "c", "c\x00", "d", "d\x00", "e", "e\x00"} {
		got, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(k), RangeEnd: []byte("f"), CountOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		page, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(k), RangeEnd: []byte("f"), Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		for _, c := range []string{"a", "b", "c", "d", "e"} {
			if c >= k {
				want++
			}
		}
		if got.Count != want || page.Count != want || page.More != (want > 1) {
			t.Fatalf("%s: [%q, f) counts %d, limit-1 page counts %d (more %v); want %d", what, k, got.Count, page.Count, page.More, want)
		}
	}
}
