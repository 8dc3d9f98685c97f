package kv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
)

func TestRevisionsFollowEtcd(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	c := s.Client

	r, err := c.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if r.Header.Revision != 1 {
		t.Fatalf("fresh store revision = %d, want 1", r.Header.Revision)
	}
	p, err := c.Put(ctx, "a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Header.Revision != 2 {
		t.Fatalf("first put revision = %d, want 2", p.Header.Revision)
	}
	p, err = c.Put(ctx, "a", "2", clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if p.Header.Revision != 3 || p.PrevKv == nil || string(p.PrevKv.Value) != "1" || p.PrevKv.ModRevision != 2 {
		t.Fatalf("second put: %+v", p)
	}
	g, err := c.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	kv := g.Kvs[0]
	if kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 || string(kv.Value) != "2" {
		t.Fatalf("kv = %+v", kv)
	}
	// A delete that deletes nothing does not bump the revision.
	d, err := c.Delete(ctx, "nothing")
	if err != nil {
		t.Fatal(err)
	}
	if d.Header.Revision != 3 || d.Deleted != 0 {
		t.Fatalf("empty delete: rev %d deleted %d", d.Header.Revision, d.Deleted)
	}
	d, err = c.Delete(ctx, "a", clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if d.Header.Revision != 4 || d.Deleted != 1 || len(d.PrevKvs) != 1 {
		t.Fatalf("delete: %+v", d)
	}
	// Past revisions read exactly.
	g, err = c.Get(ctx, "a", clientv3.WithRev(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "1" || g.Header.Revision != 4 {
		t.Fatalf("get at rev 2: %+v", g)
	}
	g, err = c.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 0 {
		t.Fatalf("deleted key still visible: %+v", g.Kvs)
	}
	// Recreated keys start over at version 1.
	if _, err := c.Put(ctx, "a", "3"); err != nil {
		t.Fatal(err)
	}
	g, _ = c.Get(ctx, "a")
	if g.Kvs[0].Version != 1 || g.Kvs[0].CreateRevision != 5 {
		t.Fatalf("recreated: %+v", g.Kvs[0])
	}
	if _, err := c.Get(ctx, "a", clientv3.WithRev(100)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("future rev: %v", err)
	}
}

func TestRangeCountLimitMore(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	c := s.Client
	for i := 0; i < 25; i++ {
		if _, err := c.Put(ctx, fmt.Sprintf("/p/%02d", i), strings.Repeat("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	g, err := c.Get(ctx, "/p/", clientv3.WithPrefix(), clientv3.WithLimit(10))
	if err != nil {
		t.Fatal(err)
	}
	if g.Count != 25 || len(g.Kvs) != 10 || !g.More {
		t.Fatalf("count %d kvs %d more %v", g.Count, len(g.Kvs), g.More)
	}
	g, err = c.Get(ctx, "/p/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if g.Count != 25 || len(g.Kvs) != 0 {
		t.Fatalf("count only: %d %d", g.Count, len(g.Kvs))
	}
	g, err = c.Get(ctx, "/p/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend), clientv3.WithLimit(3))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 3 || string(g.Kvs[0].Key) != "/p/24" || !g.More {
		t.Fatalf("sorted: %+v", g.Kvs)
	}
	g, err = c.Get(ctx, "/p/1", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if g.Count != 15 || len(g.Kvs[0].Value) != 0 {
		t.Fatalf("from key: count %d", g.Count)
	}
}

func TestTxnLikeKubeAPIServer(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	c := s.Client
	create := func(key, val string) *clientv3.TxnResponse {
		r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val)).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := create("/registry/pods/a", "x")
	if !r.Succeeded || r.Header.Revision != 2 {
		t.Fatalf("create: %+v", r)
	}
	r = create("/registry/pods/a", "y")
	if r.Succeeded || r.Header.Revision != 2 {
		t.Fatalf("second create succeeded: %+v", r)
	}
	got := r.Responses[0].GetResponseRange()
	if got == nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "x" {
		t.Fatalf("else branch: %+v", r.Responses)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	c := s.Client
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	kvc := pb.NewKVClient(c.ActiveConnection())
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"empty key put", func() error { _, err := kvc.Put(ctx, &pb.PutRequest{}); return err }, rpctypes.ErrGRPCEmptyKey},
		{"empty key range", func() error { _, err := kvc.Range(ctx, &pb.RangeRequest{}); return err }, rpctypes.ErrGRPCEmptyKey},
		{"bad sort", func() error {
			_, err := kvc.Range(ctx, &pb.RangeRequest{Key: []byte("k"), SortTarget: 99})
			return err
		}, rpctypes.ErrGRPCInvalidSortOption},
		{"too large", func() error {
			_, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 1536*1024)})
			return err
		}, rpctypes.ErrGRPCRequestTooLarge},
		{"unknown lease", func() error {
			_, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte("k"), Lease: 42})
			return err
		}, rpctypes.ErrGRPCLeaseNotFound},
		{"duplicate key", func() error {
			put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("d")}}}
			_, err := kvc.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{put, put}})
			return err
		}, rpctypes.ErrGRPCDuplicateKey},
		{"too many ops", func() error {
			var ops []*pb.RequestOp
			for i := 0; i < 129; i++ {
				ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(fmt.Sprint(i))}}})
			}
			_, err := kvc.Txn(ctx, &pb.TxnRequest{Success: ops})
			return err
		}, rpctypes.ErrGRPCTooManyOps},
		{"ignore value on missing key", func() error {
			_, err := kvc.Put(ctx, &pb.PutRequest{Key: []byte("missing"), IgnoreValue: true})
			return err
		}, rpctypes.ErrGRPCKeyNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || err.Error() != tc.want.Error() {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	g, err := c.Get(ctx, "", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if g.Header.Revision != 2 || g.Count != 1 || string(g.Kvs[0].Value) != "v" {
		t.Fatalf("bad input changed the store: rev %d count %d", g.Header.Revision, g.Count)
	}
}

func TestCompact(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	c := s.Client
	for i := 0; i < 10; i++ {
		if _, err := c.Put(ctx, "k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "other", "x"); err != nil {
		t.Fatal(err)
	}
	// revisions: puts 2..11, delete 12, other 13
	if _, err := c.Compact(ctx, 12, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k", clientv3.WithRev(11)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read below compaction: %v", err)
	}
	if _, err := c.Compact(ctx, 12); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("compact again: %v", err)
	}
	if _, err := c.Compact(ctx, 100); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("compact future: %v", err)
	}
	if _, err := c.Compact(ctx, 13, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	g, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 0 {
		t.Fatalf("deleted key reappeared after compaction: %+v", g.Kvs)
	}
	g, err = c.Get(ctx, "", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if g.Count != 1 || string(g.Kvs[0].Key) != "other" {
		t.Fatalf("after compaction: %+v", g.Kvs)
	}
}
