package mvcc

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
)

func TestProbeOldRevisionRead(t *testing.T) {
	ctx := context.Background()
	s := openInternal(t, testdb.Open(t), Config{SoleWriter: true})
	const n = 20_000
	fill(t, s, "p/", n, 0)
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("p/"), RangeEnd: []byte("p0")})
	if err != nil {
		t.Fatal(err)
	}
	for _, keysOnly := range []bool{true, false} {
		start := time.Now()
		r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("p/"), RangeEnd: []byte("p0"), Revision: d.Header.Revision - 1, KeysOnly: keysOnly})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("keysOnly %v: %d keys at the revision before the delete in %v", keysOnly, len(r.Kvs), time.Since(start))
	}
	start := time.Now()
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("p/"), RangeEnd: []byte("p0"), Revision: d.Header.Revision - 1, CountOnly: true})
	t.Logf("count %d in %v (%v)", r.GetCount(), time.Since(start), err)
}
