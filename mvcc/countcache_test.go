package mvcc_test

import (
	"context"
	"fmt"
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
