package tenant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// withClock runs the router's quotas on a clock the test moves.
func withClock(c *fakeclock.Clock) func(*Config) {
	return func(cfg *Config) { cfg.Now = c.Now }
}

func (e *env) createWith(name string, q Quotas) {
	e.t.Helper()
	if _, err := e.router.Registry().CreateWithQuotas(ctxT(e.t), name, q); err != nil {
		e.t.Fatal(err)
	}
}

// isCode reports whether err is a gRPC error of code with msg in it.
func isCode(err error, code codes.Code, msg string) bool {
	st, ok := status.FromError(err)
	return err != nil && ok && st.Code() == code && strings.Contains(st.Message(), msg)
}

// rev is the tenant's revision.
func rev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	return must(cli.Get(ctxT(t), "\x00"))(t).Header.Revision
}

// TestKeyQuota: a Put or Txn that would create a key past the quota fails
// with ResourceExhausted and changes nothing; overwrites still pass, and a
// delete makes room again once the count is refreshed.
func TestKeyQuota(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	e := startRouter(t, false, withClock(clk))
	ctx := ctxT(t)
	e.createWith("keys", Quotas{Keys: 3})
	cli := e.client("keys")
	for i := range 3 {
		must(cli.Put(ctx, fmt.Sprintf("k%d", i), "v"))(t)
	}
	before := rev(t, cli)
	if _, err := cli.Put(ctx, "k3", "v"); !isCode(err, codes.ResourceExhausted, "tenant key quota exceeded") {
		t.Fatalf("4th key: %v, want the key quota's refusal", err)
	}
	txn := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("k9"), "=", 0)).Then(clientv3.OpPut("k9", "v"))
	if _, err := txn.Commit(); !isCode(err, codes.ResourceExhausted, "tenant key quota exceeded") {
		t.Fatalf("Txn creating a 4th key: %v, want the key quota's refusal", err)
	}
	if g := must(cli.Get(ctx, "k", clientv3.WithPrefix()))(t); len(g.Kvs) != 3 || g.Header.Revision != before {
		t.Fatalf("refused writes changed the tenant: %d keys at revision %d (was %d)", len(g.Kvs), g.Header.Revision, before)
	}
	must(cli.Put(ctx, "k0", "overwrite"))(t)
	must(cli.Delete(ctx, "k1"))(t)
	clk.Advance(keyCountRefresh)
	must(cli.Put(ctx, "k3", "v"))(t)
	if _, err := cli.Put(ctx, "k4", "v"); !isCode(err, codes.ResourceExhausted, "tenant key quota exceeded") {
		t.Fatalf("4th key after a delete and a create: %v", err)
	}
}

// TestRequestQuota: a tenant's token bucket refuses requests past its
// burst with etcd's "too many requests" until the clock refills it; another
// tenant is not limited.
func TestRequestQuota(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	e := startRouter(t, false, withClock(clk))
	ctx := ctxT(t)
	e.createWith("slow", Quotas{RequestsPerSecond: 2, RequestBurst: 3})
	e.create("free")
	slow, free := e.client("slow"), e.client("free")
	for i := range 3 {
		if _, err := slow.Get(ctx, "k"); err != nil {
			t.Fatalf("request %d of a burst of 3: %v", i, err)
		}
	}
	if _, err := slow.Put(ctx, "k", "v"); !errors.Is(err, rpctypes.ErrTooManyRequests) {
		t.Fatalf("request past the burst: %v, want %v", err, rpctypes.ErrTooManyRequests)
	}
	for range 10 {
		must(free.Put(ctx, "k", "v"))(t)
	}
	clk.Advance(time.Second) // two tokens
	must(slow.Get(ctx, "k"))(t)
	g := must(slow.Get(ctx, "k"))(t)
	if len(g.Kvs) != 0 {
		t.Fatalf("the refused Put wrote: %v", g.Kvs)
	}
	if _, err := slow.Get(ctx, "k"); !errors.Is(err, rpctypes.ErrTooManyRequests) {
		t.Fatalf("third request in a second at 2/s: %v", err)
	}
}

// TestWatcherQuota: a watch create past the quota is canceled with the
// quota's reason; the open watches keep delivering, and a canceled watch
// frees its place.
func TestWatcherQuota(t *testing.T) {
	e := startRouter(t, false)
	ctx := ctxT(t)
	e.createWith("watchful", Quotas{Watchers: 2})
	cli := e.client("watchful")
	wctx1, cancel1 := context.WithCancel(ctx)
	w1 := cli.Watch(clientv3.WithRequireLeader(wctx1), "a", clientv3.WithCreatedNotify())
	w2 := cli.Watch(ctx, "b", clientv3.WithCreatedNotify())
	for _, w := range []clientv3.WatchChan{w1, w2} {
		if r := <-w; !r.Created || r.Err() != nil {
			t.Fatalf("watch within the quota: %+v %v", r, r.Err())
		}
	}
	w3 := cli.Watch(ctx, "c", clientv3.WithCreatedNotify())
	r, ok := <-w3
	if !ok || !r.Canceled || !strings.Contains(r.Err().Error(), "tenant watcher quota exceeded") {
		t.Fatalf("third watch: %+v %v, want canceled for the watcher quota", r, r.Err())
	}
	if _, open := <-w3; open {
		t.Fatal("the refused watch stayed open")
	}
	must(cli.Put(ctx, "b", "v"))(t)
	if r := <-w2; len(r.Events) != 1 || string(r.Events[0].Kv.Key) != "b" {
		t.Fatalf("open watch after a refusal: %+v %v", r, r.Err())
	}
	cancel1()
	for range w1 { // drained once its cancel is answered
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, ok := <-cli.Watch(ctx, "d", clientv3.WithCreatedNotify())
		if ok && r.Created && r.Err() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a canceled watch never freed its place: %+v %v", r, r.Err())
		}
	}
}

// TestSetQuotaLive: quotas set on a running tenant's server apply from
// the request after the next transaction, without a restart.
func TestSetQuotaLive(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	e := startRouter(t, false, withClock(clk))
	ctx := ctxT(t)
	e.create("live")
	cli := e.client("live")
	addr := "https://" + e.addr
	before := must(cli.Status(ctx, addr))(t)
	for i := range 5 {
		must(cli.Put(ctx, fmt.Sprintf("k%d", i), "v"))(t)
	}
	keys, rps, burst, bytes := int64(5), 1.0, int64(2), int64(1<<20)
	if _, err := e.router.Registry().ChangeQuotas(ctx, "live", QuotaChange{Keys: &keys, BackendBytes: &bytes}); err != nil {
		t.Fatal(err)
	}
	must(cli.Get(ctx, "k0"))(t) // its transaction reads the new quotas
	if _, err := cli.Put(ctx, "k5", "v"); !isCode(err, codes.ResourceExhausted, "tenant key quota exceeded") {
		t.Fatalf("key quota set on the running server: %v", err)
	}
	if st := must(cli.Status(ctx, addr))(t); st.DbSizeQuota != bytes || st.Header.MemberId != before.Header.MemberId {
		t.Fatalf("byte quota set on the running server: status %d, want %d", st.DbSizeQuota, bytes)
	}
	if _, err := e.router.Registry().ChangeQuotas(ctx, "live", QuotaChange{RequestsPerSecond: &rps, RequestBurst: &burst}); err != nil {
		t.Fatal(err)
	}
	must(cli.Get(ctx, "k0"))(t) // reads the new quotas; a full bucket of 2 follows
	must(cli.Get(ctx, "k0"))(t)
	must(cli.Get(ctx, "k0"))(t)
	if _, err := cli.Get(ctx, "k0"); !errors.Is(err, rpctypes.ErrTooManyRequests) {
		t.Fatalf("request quota set on the running server: %v", err)
	}
	if e.router.Running() != 1 {
		t.Fatalf("%d servers running", e.router.Running())
	}
	rec := must(e.router.Registry().Get(ctx, "live"))(t)
	if rec.Keys != 5 || rec.RequestsPerSecond != 1 || rec.RequestBurst != 2 || rec.BackendBytes != bytes {
		t.Fatalf("record after two changes: %+v", rec)
	}
}

// TestInvalidQuotas are refused and change nothing.
func TestInvalidQuotas(t *testing.T) {
	e := startRouter(t, false)
	ctx := ctxT(t)
	reg := e.router.Registry()
	if _, err := reg.CreateWithQuotas(ctx, "bad", Quotas{Keys: -1}); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("negative key quota: %v", err)
	}
	if _, err := reg.Get(ctx, "bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused create left %v", err)
	}
	e.create("ok")
	burst := int64(5)
	if _, err := reg.ChangeQuotas(ctx, "ok", QuotaChange{RequestBurst: &burst}); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("a burst without a rate: %v", err)
	}
	if r := must(reg.Get(ctx, "ok"))(t); r.Quotas != (Quotas{}) {
		t.Fatalf("a refused change left %+v", r.Quotas)
	}
}

// countingWaits counts the WaitChange calls on one key of the shared store.
type countingWaits struct {
	storage.DB
	key   []byte
	waits atomic.Int64
}

func (c *countingWaits) WaitChange(ctx context.Context, key, seen []byte) error {
	if bytes.Equal(key, c.key) {
		c.waits.Add(1)
	}
	return c.DB.WaitChange(ctx, key, seen)
}

// TestQuotaChangeWakesOnce: the live marker now changes with the quotas,
// and the running server's deletion watch waits again from the new value:
// one wait per change, not a spin on a value the marker no longer has.
func TestQuotaChangeWakesOnce(t *testing.T) {
	db := &countingWaits{DB: testdb.Open(t)}
	e := startRouterOn(t, db, false)
	ctx := ctxT(t)
	rec := must(e.router.Registry().Create(ctx, "w", 0))(t)
	db.key = keyspace.TenantLive(rec.ID)
	cli := e.client("w")
	must(cli.Put(ctx, "k", "v"))(t)
	const changes = 3
	for i := range int64(changes) {
		keys := i + 1
		if _, err := e.router.Registry().ChangeQuotas(ctx, "w", QuotaChange{Keys: &keys}); err != nil {
			t.Fatal(err)
		}
		must(cli.Get(ctx, "k"))(t)
	}
	must(0, e.router.Registry().Delete(ctx, "w"))(t)
	deadline := time.Now().Add(30 * time.Second)
	for e.router.Running() != 0 { // the watch has seen the delete and returned
		if time.Now().After(deadline) {
			t.Fatal("the deleted tenant's server never stopped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := db.waits.Load(); n > 1+changes {
		t.Fatalf("%d waits on the live marker for %d quota changes, want at most %d", n, changes, 1+changes)
	}
}
