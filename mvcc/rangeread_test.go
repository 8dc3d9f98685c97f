package mvcc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// TestRangeAtRevisionZeroOutlivesCompaction pages a Range at revision 0 while
// a compaction passes the revision its first page read: etcd never answers a
// Range at revision 0 with ErrCompacted, so it must succeed, with a complete
// and consistent result: the keys at its header's revision.
func TestRangeAtRevisionZeroOutlivesCompaction(t *testing.T) {
	ctx := context.Background()
	db := &viewHook{DB: openPebble(t)}
	s := openStore(t, db, mvcc.Config{PageKeys: 10})
	hooked := context.WithValue(ctx, hookedKey{}, true)
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
		views := 0
		var putRev int64
		db.hook = func() {
			if views++; views != 2 { // after the first page
				return
			}
			put, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k/99"), Value: []byte("v")})
			if err != nil {
				t.Error(err)
				return
			}
			putRev = put.Header.Revision
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: put.Header.Revision}); err != nil {
				t.Error(err)
			}
		}
		resp, err := s.Range(hooked, r)
		if err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		want := int64(45)
		if resp.Header.Revision >= putRev {
			want = 46
		}
		if resp.Count != want || resp.Kvs[len(resp.Kvs)-1].ModRevision > resp.Header.Revision {
			t.Fatalf("range %v: count %d at header %d (k/99 put at %d); want %d", r, resp.Count, resp.Header.Revision, putRev, want)
		}
		if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k/99")}); err != nil {
			t.Fatal(err)
		}
	}
}

// viewHook runs a hook before every View made with a context carrying
// hookedKey, that is, by the one request under test.
type viewHook struct {
	storage.DB
	hook func()
}

type hookedKey struct{}

func (h *viewHook) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if ctx.Value(hookedKey{}) != nil {
		h.hook()
	}
	return h.DB.View(ctx, fn)
}

// TestRangeOutlivesCompactionBeforeEveryPage rewrites every key of a paged
// Range and compacts to the new head, physically where nothing holds it
// back, before each of the Range's read transactions. etcd reads a Range in
// one read transaction, which no compaction disturbs: a Range at revision 0
// must still complete (not start over for ever), and every Range must
// return one consistent snapshot, however many versions compaction removed
// meanwhile. Nothing it pinned may be left behind.
func TestRangeOutlivesCompactionBeforeEveryPage(t *testing.T) {
	ctx := context.Background()
	db := &viewHook{DB: openPebble(t)}
	s := openStore(t, db, mvcc.Config{PageKeys: 10})
	const keys = 45
	round := 0
	rewrite := func() int64 {
		round++
		var rev int64
		for i := 0; i < keys; i++ {
			put, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k/%02d", i)), Value: []byte(fmt.Sprintf("v%d", round))})
			if err != nil {
				t.Fatal(err)
			}
			rev = put.Header.Revision
		}
		return rev
	}
	first := rewrite()
	db.hook = func() {
		rev := rewrite()
		// Physical: it returns once the history is gone, or, while a
		// read pin holds it back, at the deadline.
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := s.Compact(cctx, &pb.CompactionRequest{Revision: rev, Physical: true}); err != nil && cctx.Err() == nil {
			t.Error(err)
		}
	}
	for _, r := range []*pb.RangeRequest{
		{Key: []byte("k/"), RangeEnd: []byte("k0")},
		{Key: []byte("k/"), RangeEnd: []byte("k0"), KeysOnly: true},
		{Key: []byte("k/"), RangeEnd: []byte("k0"), Limit: 30},
		{Key: []byte("k/"), RangeEnd: []byte("k0"), SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_VALUE},
	} {
		rctx, cancel := context.WithTimeout(context.WithValue(ctx, hookedKey{}, true), 20*time.Second)
		resp, err := s.Range(rctx, r)
		cancel()
		if err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		if resp.Count != keys {
			t.Fatalf("range %v: count %d, want %d", r, resp.Count, keys)
		}
		for _, kv := range resp.Kvs {
			if kv.ModRevision > resp.Header.Revision || !r.KeysOnly && !bytes.Equal(kv.Value, resp.Kvs[0].Value) {
				t.Fatalf("range %v at header %d: %s=%q at %d, first value %q: not one snapshot", r, resp.Header.Revision, kv.Key, kv.Value, kv.ModRevision, resp.Kvs[0].Value)
			}
		}
	}
	// At an old revision the versions it needs are gone once the first
	// page is read: etcd's answer, ErrCompacted.
	rctx, cancel := context.WithTimeout(context.WithValue(ctx, hookedKey{}, true), 20*time.Second)
	defer cancel()
	if _, err := s.Range(rctx, &pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0"), Revision: first}); !errors.Is(err, mvcc.ErrCompacted) {
		t.Fatalf("range at compacted revision %d: %v, want ErrCompacted", first, err)
	}
	db.hook = func() {}
	b, e := keyspace.ReadPins()
	if err := db.View(ctx, func(tx storage.ReadTx) error {
		pins, err := tx.GetRange(b, e, storage.RangeOptions{})
		if len(pins) != 0 {
			t.Errorf("%d read pins left behind", len(pins))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
