package etcdcompat

import (
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestRangeCountCompat sends every combination of sort order and target,
// revision filter, limit, keys_only, count_only and revision, and after each
// one counts the ranges that start right after the keys it returned, at the
// same revision: etcd's counts are always exact, so whatever a server
// remembers from one Range must not change another's count.
func TestRangeCountCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	// Keys whose create and mod revisions are not in key order: later keys
	// are created first, some are updated, one is deleted and recreated.
	keys := []string{"c/a", "c/b", "c/c", "c/d", "c/e", "c/f", "c/g"}
	for i := len(keys) - 1; i >= 0; i-- {
		p.check(t, "setup", &pb.PutRequest{Key: []byte(keys[i]), Value: []byte(fmt.Sprintf("v%d", i%3))})
	}
	p.check(t, "setup", &pb.PutRequest{Key: []byte("c/c"), Value: []byte("v9")})
	p.check(t, "setup", &pb.DeleteRangeRequest{Key: []byte("c/e")})
	p.check(t, "setup", &pb.PutRequest{Key: []byte("c/e"), Value: []byte("v0")})
	past := p.refRev(t)
	p.check(t, "setup", &pb.PutRequest{Key: []byte("c/b"), Value: []byte("v5")})
	p.check(t, "setup", &pb.DeleteRangeRequest{Key: []byte("c/g")})

	orders := []pb.RangeRequest_SortOrder{pb.RangeRequest_NONE, pb.RangeRequest_ASCEND, pb.RangeRequest_DESCEND}
	targets := []pb.RangeRequest_SortTarget{pb.RangeRequest_KEY, pb.RangeRequest_VERSION, pb.RangeRequest_CREATE, pb.RangeRequest_MOD, pb.RangeRequest_VALUE}
	filters := []struct {
		name string
		set  func(r *pb.RangeRequest, mid int64)
	}{
		{"none", func(*pb.RangeRequest, int64) {}},
		{"min_mod", func(r *pb.RangeRequest, mid int64) { r.MinModRevision = mid }},
		{"max_mod", func(r *pb.RangeRequest, mid int64) { r.MaxModRevision = mid }},
		{"min_create", func(r *pb.RangeRequest, mid int64) { r.MinCreateRevision = mid }},
		{"max_create", func(r *pb.RangeRequest, mid int64) { r.MaxCreateRevision = mid }},
		{"mod_window", func(r *pb.RangeRequest, mid int64) { r.MinModRevision, r.MaxModRevision = mid-2, mid+2 }},
	}
	n := 0
	for _, rev := range []int64{0, past} {
		for _, order := range orders {
			for _, target := range targets {
				for _, f := range filters {
					for _, limit := range []int64{0, 1, 2, 4} {
						for _, only := range []struct{ keys, count bool }{{false, false}, {true, false}, {false, true}} {
							// A write outside the range first, so that whatever this
							// Range leaves behind is the newest thing a server knows.
							p.check(t, "bump", &pb.PutRequest{Key: []byte("z"), Value: []byte("v")})
							r := &pb.RangeRequest{Key: []byte("c/"), RangeEnd: []byte("c0"), Revision: rev, Limit: limit,
								SortOrder: order, SortTarget: target, KeysOnly: only.keys, CountOnly: only.count}
							f.set(r, 4)
							what := fmt.Sprintf("combination %d (%s)", n, f.name)
							o := p.check(t, what, r)
							n++
							resp, ok := o.refResp.(*pb.RangeResponse)
							if !ok {
								continue
							}
							for _, kv := range resp.Kvs {
								checkCountsFrom(t, p, what, kv.Key, rev)
							}
						}
					}
				}
			}
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d range combinations, each followed by the counts after its keys", n)
}

// checkCountsFrom compares, at rev, the count of the range from key (and
// from just after key) to the end of the test's range, alone and with a
// limit of 1.
func checkCountsFrom(t *testing.T, p *pair, what string, key []byte, rev int64) {
	t.Helper()
	for _, start := range [][]byte{key, append(append([]byte(nil), key...), 0)} {
		p.check(t, what+" then count", &pb.RangeRequest{Key: start, RangeEnd: []byte("c0"), Revision: rev, CountOnly: true})
		p.check(t, what+" then first page", &pb.RangeRequest{Key: start, RangeEnd: []byte("c0"), Revision: rev, Limit: 1, KeysOnly: true})
	}
}
