package kv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// fillKeys puts n keys under prefix, of about the length of a kube object's
// key, in Txns of 128 puts (etcd's limit).
func fillKeys(t *testing.T, c *clientv3.Client, prefix string, n int, lease clientv3.LeaseID) {
	t.Helper()
	ctx := context.Background()
	name := strings.Repeat("x", 60)
	for i := 0; i < n; i += 128 {
		var ops []clientv3.Op
		for j := i; j < min(n, i+128); j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sns/%s-%07d", prefix, name, j), "v", clientv3.WithLease(lease)))
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// deletesAt collects the delete events of one watch until it has n of
// them, and returns how many responses carried them and at which
// revisions.
func deletesAt(t *testing.T, ch clientv3.WatchChan, n int) (responses int, revs map[int64]int) {
	t.Helper()
	revs = map[int64]int{}
	got := 0
	timeout := time.After(5 * time.Minute)
	for got < n {
		select {
		case r, ok := <-ch:
			if !ok || r.Err() != nil {
				t.Fatalf("watch ended after %d events: %v", got, r.Err())
			}
			responses++
			for _, ev := range r.Events {
				if ev.Type != mvccpb.DELETE {
					t.Fatalf("event %v", ev)
				}
				revs[ev.Kv.ModRevision]++
				got++
			}
		case <-timeout:
			t.Fatalf("%d of %d delete events after 5 minutes", got, n)
		}
	}
	return responses, revs
}

// TestLargeDeleteAndRevoke: through gRPC and clientv3, on storage with
// FoundationDB's limits, a DeleteRange of 60,000 keys and a revoke of a
// lease holding 60,000 keys (each failed with codes.Unknown, the storage's
// transaction_too_large, before they were staged) each succeed at one
// revision, and a watcher gets every delete event at that revision in one
// response, as etcd sends them. A Txn too large for one transaction fails
// alone with one of etcd's errors ("request is too large", or "request
// timed out" when reading its keys outlasts a transaction) and changes
// nothing.
func TestLargeDeleteAndRevoke(t *testing.T) {
	const n = 60_000 // of kube-length keys: each request writes over 10 MB
	db := faulty.Wrap(testdb.Open(t), faulty.Options{})
	s := testserver.Start(t, testserver.Options{DB: db})
	c := s.Client
	ctx := context.Background()
	g, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	fillKeys(t, c, "/del/", n, 0)
	fillKeys(t, c, "/lease/", n, g.ID)
	_, err = c.Txn(ctx).Then(clientv3.OpDelete("/", clientv3.WithPrefix())).Commit()
	if !errors.Is(err, rpctypes.ErrRequestTooLarge) && !errors.Is(err, rpctypes.ErrTimeout) {
		t.Fatalf("Txn deleting %d keys: %v, want %v or %v", 2*n, err, rpctypes.ErrRequestTooLarge, rpctypes.ErrTimeout)
	}
	r, err := c.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 2*n {
		t.Fatalf("after the refused Txn: %v, %v", r, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dels := c.Watch(wctx, "/del/", clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
	leased := c.Watch(wctx, "/lease/", clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))

	start := time.Now()
	d, err := c.Delete(ctx, "/del/", clientv3.WithPrefix())
	if err != nil || d.Deleted != n || d.Header.Revision != r.Header.Revision+1 {
		t.Fatalf("delete: %+v, %v", d, err)
	}
	t.Logf("DeleteRange of %d keys: %v", n, time.Since(start))
	start = time.Now()
	v, err := c.Revoke(ctx, g.ID)
	if err != nil || v.Header.Revision != d.Header.Revision+1 {
		t.Fatalf("revoke: %+v, %v", v, err)
	}
	t.Logf("revoke of a lease with %d keys: %v", n, time.Since(start))
	for _, w := range []struct {
		ch  clientv3.WatchChan
		rev int64
	}{{dels, d.Header.Revision}, {leased, v.Header.Revision}} {
		responses, revs := deletesAt(t, w.ch, n)
		if responses != 1 || len(revs) != 1 || revs[w.rev] != n {
			t.Fatalf("%d delete events in %d responses at revisions %v, want all at %d in one", n, responses, revs, w.rev)
		}
	}
	r, err = c.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("after: %v, %v", r, err)
	}
	if _, err := c.TimeToLive(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if n := db.Stats.LimitErrors.Load(); n > 1 {
		t.Fatalf("%d transactions refused by the storage's limits; want at most the Txn's", n)
	}
}
