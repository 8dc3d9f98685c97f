package mvcc_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// beforeView runs a hook before the nth View of the store it wraps.
type beforeView struct {
	storage.DB
	n    atomic.Int64
	at   int64
	hook func()
}

func (b *beforeView) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if b.n.Add(1) == b.at {
		b.hook()
	}
	return b.DB.View(ctx, fn)
}

// TestRangeAtRevisionZeroOutlivesCompaction pages a Range at revision 0 while
// a compaction passes the revision its first page read: etcd never answers a
// Range at revision 0 with ErrCompacted, so it must succeed, with a complete
// and consistent result.
func TestRangeAtRevisionZeroOutlivesCompaction(t *testing.T) {
	ctx := context.Background()
	db := &beforeView{DB: openPebble(t)}
	s := openStore(t, db, mvcc.Config{PageKeys: 10})
	for i := 0; i < 45; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k/%02d", i)), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*pb.RangeRequest{
		{Key: []byte("k/"), RangeEnd: []byte("k0")},
		{Key: []byte("k/"), RangeEnd: []byte("k0"), KeysOnly: true},
		{Key: []byte("k/"), RangeEnd: []byte("k0"), Limit: 30},
	} {
		db.n.Store(0)
		db.at = 2 // after the first page
		db.hook = func() {
			put, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k/99"), Value: []byte("v")})
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: put.Header.Revision}); err != nil {
				t.Error(err)
			}
		}
		resp, err := s.Range(ctx, r)
		if err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		if resp.Count != 46 || resp.Kvs[len(resp.Kvs)-1].ModRevision > resp.Header.Revision {
			t.Fatalf("range %v: count %d, header %d; want the 46 keys at the newer head", r, resp.Count, resp.Header.Revision)
		}
		if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k/99")}); err != nil {
			t.Fatal(err)
		}
	}
}
