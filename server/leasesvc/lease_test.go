package leasesvc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// loops is how many loops of a server sleep on its clock: the owner
// elector's and the lessor's.
const loops = 2

func startFake(t *testing.T, db storage.DB) (*testserver.Server, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New(start)
	s := testserver.Start(t, testserver.Options{DB: db, Config: server.Config{Lease: lease.Config{Clock: clk}}})
	clk.BlockUntil(t, loops)
	return s, clk
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func checkHeader(t *testing.T, s *testserver.Server, h *pb.ResponseHeader, rev int64) {
	t.Helper()
	want := s.Header().New(rev)
	if h.GetClusterId() != want.ClusterId || h.GetMemberId() != want.MemberId || h.GetRaftTerm() != want.RaftTerm || h.GetRevision() != rev {
		t.Fatalf("header %v, want %v", h, want)
	}
}

func keepAliveRaw(t *testing.T, c *clientv3.Client, id int64) *pb.LeaseKeepAliveResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	return resp
}

func TestLeaseAPI(t *testing.T) {
	s, _ := startFake(t, nil)
	c, ctx := s.Client, tctx(t)

	g, err := c.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if g.ID <= 0 || g.TTL != 60 {
		t.Fatalf("grant = %+v", g)
	}
	checkHeader(t, s, g.ResponseHeader, 1)

	raw := pb.NewLeaseClient(c.ActiveConnection())
	gr, err := raw.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 1000, TTL: 1})
	if err != nil || gr.ID != 1000 || gr.TTL != 2 {
		t.Fatalf("grant below the minimum = %v, %v", gr, err)
	}
	if _, err := raw.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 1000, TTL: 30}); !errors.Is(err, rpctypes.ErrGRPCLeaseExist) {
		t.Fatalf("duplicate grant: %v", err)
	}
	if _, err := raw.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 1001, TTL: lease.MaxLeaseTTL + 1}); !errors.Is(err, rpctypes.ErrGRPCLeaseTTLTooLarge) {
		t.Fatalf("huge TTL: %v", err)
	}

	// Put with an unknown lease fails; ignore_lease keeps the key's lease.
	if _, err := c.Put(ctx, "k0", "v", clientv3.WithLease(4242)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("put with unknown lease: %v", err)
	}
	if _, err := c.Put(ctx, "k1", "v1", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "k2", "v2", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "k1", "v1b", clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	gk, err := c.Get(ctx, "k1")
	if err != nil || gk.Kvs[0].Lease != int64(g.ID) || string(gk.Kvs[0].Value) != "v1b" {
		t.Fatalf("after ignore_lease put: %v %v", gk, err)
	}
	if _, err := c.Put(ctx, "nokey", "v", clientv3.WithIgnoreLease()); !errors.Is(err, rpctypes.ErrKeyNotFound) {
		t.Fatalf("ignore_lease on a missing key: %v", err)
	}

	ttl, err := c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != 60 || ttl.GrantedTTL != 60 || len(ttl.Keys) != 2 || string(ttl.Keys[0]) != "k1" || string(ttl.Keys[1]) != "k2" {
		t.Fatalf("TimeToLive = %+v", ttl)
	}
	checkHeader(t, s, ttl.ResponseHeader, 4)
	unk, err := raw.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: 4242, Keys: true})
	if err != nil || unk.TTL != -1 || unk.ID != 4242 {
		t.Fatalf("TimeToLive of unknown lease = %v, %v", unk, err)
	}
	checkHeader(t, s, unk.Header, 4)

	ls, err := c.Leases(ctx)
	if err != nil || len(ls.Leases) != 2 || ls.Leases[0].ID != 1000 || ls.Leases[1].ID != g.ID {
		t.Fatalf("Leases = %+v, %v", ls, err)
	}
	checkHeader(t, s, ls.ResponseHeader, 4)

	ka, err := c.KeepAliveOnce(ctx, g.ID)
	if err != nil || ka.TTL != 60 || ka.ID != g.ID {
		t.Fatalf("KeepAliveOnce = %+v, %v", ka, err)
	}
	checkHeader(t, s, ka.ResponseHeader, 4)
	if r := keepAliveRaw(t, c, 4242); r.TTL != 0 || r.ID != 4242 {
		t.Fatalf("keep-alive of unknown lease = %v, want TTL 0", r)
	}

	rv, err := c.Revoke(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, s, rv.Header, 5)
	if gr, _ := c.Get(ctx, "k", clientv3.WithPrefix()); len(gr.Kvs) != 0 {
		t.Fatalf("keys left after revoke: %v", gr.Kvs)
	}
	if evs := revisionEvents(t, c, 5); len(evs) != 1 || len(evs[5]) != 2 {
		t.Fatalf("revoke events = %v", evs)
	}
	if _, err := c.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("second revoke: %v", err)
	}
	// A revoke that deletes no keys leaves the revision alone.
	rv, err = c.Revoke(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	checkHeader(t, s, rv.Header, 5)
	if _, err := c.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("keep-alive of revoked lease: %v", err)
	}
}

// TestKeepAliveStream runs clientv3's own keep-alive loop over the stream.
func TestKeepAliveStream(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	c, ctx := s.Client, tctx(t)
	g, err := c.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := c.KeepAlive(kctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case r, ok := <-ch:
			if !ok || r.TTL != 5 {
				t.Fatalf("keep-alive response %+v (open %t)", r, ok)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no keep-alive response")
		}
	}
}

// TestExpiryOverGRPC: with a fake clock, a lease expires at its deadline and
// its keys go in one revision of DELETE events with prev_kv.
func TestExpiryOverGRPC(t *testing.T) {
	s, clk := startFake(t, nil)
	c, ctx := s.Client, tctx(t)
	g, err := c.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := c.Put(ctx, fmt.Sprintf("e%d", i), "v", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
	}
	advance := func(d time.Duration) {
		for ; d > 0; d -= 500 * time.Millisecond {
			clk.Advance(min(d, 500*time.Millisecond))
			clk.BlockUntil(t, loops)
		}
	}
	advance(4500 * time.Millisecond)
	if r, _ := c.Get(ctx, "e", clientv3.WithPrefix(), clientv3.WithCountOnly()); r.Count != 3 {
		t.Fatalf("expired early: %d keys", r.Count)
	}
	advance(time.Second)
	r, err := c.Get(ctx, "e", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 0 || r.Header.Revision != 5 {
		t.Fatalf("after expiry: %v %v", r, err)
	}
	evs := revisionEvents(t, c, 5)
	if len(evs) != 1 {
		t.Fatalf("events = %v", evs)
	}
	for i, ev := range evs[5] {
		if ev.Type != mvccpb.DELETE || string(ev.Kv.Key) != fmt.Sprintf("e%d", i) || ev.PrevKv == nil || ev.PrevKv.Lease != int64(g.ID) {
			t.Fatalf("event %d = %v", i, ev)
		}
	}
	if tl, err := c.TimeToLive(ctx, g.ID); err != nil || tl.TTL != -1 {
		t.Fatalf("TimeToLive after expiry = %+v, %v", tl, err)
	}
}

// TestTwoServersOneStore: two fdb-etcd servers on one store; a lease granted
// at one and kept alive at the other survives, and expires exactly once.
func TestTwoServersOneStore(t *testing.T) {
	db := testdb.Open(t)
	a, clkA := startFake(t, db)
	b, clkB := startFake(t, db)
	ctx := tctx(t)
	advance := func(d time.Duration) {
		for ; d > 0; d -= 500 * time.Millisecond {
			for _, clk := range []*fakeclock.Clock{clkA, clkB} {
				clk.Advance(min(d, 500*time.Millisecond))
				clk.BlockUntil(t, loops)
			}
		}
	}
	kept, err := a.Client.Grant(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	lapsed, err := b.Client.Grant(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := b.Client.Put(ctx, fmt.Sprintf("kept/%d", i), "v", clientv3.WithLease(kept.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Client.Put(ctx, fmt.Sprintf("lapsed/%d", i), "v", clientv3.WithLease(lapsed.ID)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*testserver.Server{a, b} {
		if ls, err := s.Client.Leases(ctx); err != nil || len(ls.Leases) != 2 {
			t.Fatalf("Leases = %v, %v", ls, err)
		}
	}
	for range 4 {
		advance(2 * time.Second)
		if _, err := b.Client.KeepAliveOnce(ctx, kept.ID); err != nil {
			t.Fatal(err)
		}
	}
	count := func(s *testserver.Server, prefix string) int64 {
		r, err := s.Client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	if count(a, "kept/") != 5 || count(b, "lapsed/") != 0 {
		t.Fatalf("wrong lease expired: kept %d lapsed %d", count(a, "kept/"), count(b, "lapsed/"))
	}
	if evs := revisionEvents(t, a.Client, 12); len(evs) != 1 || len(evs[12]) != 5 {
		t.Fatalf("expiry revisions = %v", evs)
	}
	ownA, ownB := expiryOwner(t, a), expiryOwner(t, b)
	if ownA == ownB {
		t.Fatalf("owners: a %t b %t", ownA, ownB)
	}
}

// TestKeepAlivePastDeadlineOverGRPC: a keep-alive that reaches a replica
// after a lease's deadline, before the owner's revoke has committed, is not
// a renewal: it is answered once the revoke is done, with TTL 0 (etcd's
// answer for a lease that is gone), and the lease's keys are deleted.
func TestKeepAlivePastDeadlineOverGRPC(t *testing.T) {
	db := testdb.Open(t)
	a, clkA := startFake(t, db) // the owner
	b, clkB := startFake(t, db)
	ctx := tctx(t)
	g, err := a.Client.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.Put(ctx, "held", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	// b's clock passes the deadline (but not the ownership TTL); a's does
	// not, so the lease is due and not yet revoked.
	clkB.Advance(2500 * time.Millisecond)
	clkB.BlockUntil(t, loops)
	st, err := pb.NewLeaseClient(b.Client.ActiveConnection()).LeaseKeepAlive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.LeaseKeepAliveRequest{ID: int64(g.ID)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *pb.LeaseKeepAliveResponse, 1)
	go func() {
		resp, err := st.Recv()
		if err != nil {
			t.Error(err)
		}
		got <- resp
	}()
	// While the lease is due and not revoked, nothing answers: a renewal
	// now would revive it.
	select {
	case resp := <-got:
		t.Fatalf("keep-alive answered %v while the lease was due, before its revoke", resp)
	case <-time.After(time.Second):
	}
	clkA.Advance(2500 * time.Millisecond)
	clkA.BlockUntil(t, loops)
	select {
	case resp := <-got:
		if resp == nil || resp.TTL != 0 || resp.ID != int64(g.ID) {
			t.Fatalf("keep-alive past the deadline = %v, want TTL 0", resp)
		}
	case <-ctx.Done():
		t.Fatal("no keep-alive response after the revoke")
	}
	if r, err := b.Client.Get(ctx, "held"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the expired lease's key: %v, %v", r, err)
	}
}

// revisionEvents reads, through a watch from revision from, the events of
// every revision from there to the current one, by revision, with their
// previous values.
func revisionEvents(t *testing.T, c *clientv3.Client, from int64) map[int64][]*clientv3.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(tctx(t), 30*time.Second)
	defer cancel()
	head, err := c.Get(ctx, "\x00")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]*clientv3.Event{}
	if head.Header.Revision < from {
		return out
	}
	w := c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from), clientv3.WithPrevKV())
	for last := int64(0); last < head.Header.Revision; {
		resp, ok := <-w
		if !ok || resp.Err() != nil {
			t.Fatalf("watch from %d ended at %d: %v", from, last, resp.Err())
		}
		for _, ev := range resp.Events {
			last = ev.Kv.ModRevision
			out[last] = append(out[last], ev)
		}
	}
	return out
}

// expiryOwner reports whether s owns lease expiry, as its metrics say.
func expiryOwner(t *testing.T, s *testserver.Server) bool {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "fdb_etcd_lease_expiry_owner" {
			return mf.GetMetric()[0].GetGauge().GetValue() == 1
		}
	}
	t.Fatal("no fdb_etcd_lease_expiry_owner metric")
	return false
}
