package tenant

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// idleTimers is an AfterFunc the test fires by hand.
type idleTimers struct {
	mu      sync.Mutex
	pending map[int]func()
	next    int
}

func (it *idleTimers) AfterFunc(_ time.Duration, f func()) func() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.pending == nil {
		it.pending = map[int]func(){}
	}
	id := it.next
	it.next++
	it.pending[id] = f
	return func() bool {
		it.mu.Lock()
		defer it.mu.Unlock()
		_, ok := it.pending[id]
		delete(it.pending, id)
		return ok
	}
}

// fire runs every pending idle stop and reports how many there were.
func (it *idleTimers) fire() int {
	it.mu.Lock()
	fs := it.pending
	it.pending = nil
	it.mu.Unlock()
	for _, f := range fs {
		f()
	}
	return len(fs)
}

type env struct {
	t      testing.TB
	ca     *tlstest.CA
	addr   string
	router *Router
	db     storage.DB
	timers *idleTimers
}

// startRouter serves a router on loopback over a fresh shared store, with
// a real TLS configuration that requires client certificates.
func startRouter(t testing.TB, autoCreate bool, opts ...func(*Config)) *env {
	return startRouterOn(t, testdb.Open(t), autoCreate, opts...)
}

// startRouterOn is startRouter over db.
func startRouterOn(t testing.TB, db storage.DB, autoCreate bool, opts ...func(*Config)) *env {
	ca := tlstest.NewCA(t, "tenant-test-ca")
	files := tlstest.Write(t, t.TempDir(), ca.Server(t, "localhost"), ca)
	rl, err := tlsconfig.New(tlsconfig.Config{CertFile: files.Cert, KeyFile: files.Key,
		TrustedCAFile: files.CA, ClientCertAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	sc := server.Config{Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	if _, bench := t.(*testing.B); bench {
		sc.Logger = zap.NewNop() // a benchmark's log would stay in memory and count as the tenants'
	}
	sc.MVCC.SoleWriter = testdb.Backend() == "pebble"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	timers := &idleTimers{}
	cfg := Config{Server: sc, TLS: rl.ServerConfig(), AutoCreate: autoCreate, AfterFunc: timers.AfterFunc,
		Logger: sc.Logger, Members: replicaMembers(t, db, "replica", l.Addr().String())}
	for _, o := range opts {
		o(&cfg)
	}
	r, err := NewRouter(cfg, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Serve(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return &env{t: t, ca: ca, addr: l.Addr().String(), router: r, db: db, timers: timers}
}

// replicaMembers keeps a replica's member record in the root keyspace, as
// the process's own server does, until the test ends.
func replicaMembers(t testing.TB, db storage.DB, name, addr string) cluster.Members {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := fnv.New64a()
	id.Write([]byte(name))
	reg, err := cluster.NewRegistry(ctx, db, cluster.RegistryConfig{ID: id.Sum64(), Name: name, ClientURLs: []string{"https://" + addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	return reg.Members
}

// client dials the router with a client certificate for cn; the client
// closes when the test ends.
func (e *env) client(cn string) *clientv3.Client {
	e.t.Helper()
	cli := e.dial(e.clientCert(cn))
	e.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (e *env) clientCert(cn string) tls.Certificate { return e.ca.Client(e.t, cn).TLS(e.t) }

func (e *env) dial(cert tls.Certificate) *clientv3.Client {
	e.t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://" + e.addr},
		DialTimeout: 10 * time.Second,
		TLS:         &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: e.ca.Pool()},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return cli
}

func (e *env) create(names ...string) {
	e.t.Helper()
	for _, n := range names {
		if _, err := e.router.Registry().Create(ctxT(e.t), n, 0); err != nil {
			e.t.Fatal(err)
		}
	}
}

// must(call())(t) is call's value, or t fails with its error.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// TestIsolation: two tenants on one router and one store see only their
// own keyspace through every service.
func TestIsolation(t *testing.T) {
	e := startRouter(t, false)
	e.create("alice", "bob")
	ctx := ctxT(t)
	alice, bob := e.client("alice"), e.client("bob")

	for i, k := range []string{"\x00", "shared", "only-alice"} {
		r := must(alice.Put(ctx, k, "alice-secret"))(t)
		if r.Header.Revision != int64(i+2) {
			t.Fatalf("alice's put %d at revision %d, want %d", i, r.Header.Revision, i+2)
		}
	}
	r := must(bob.Put(ctx, "shared", "bob"))(t)
	if r.Header.Revision != 2 {
		t.Fatalf("bob's first put at revision %d, want 2: alice's writes moved it", r.Header.Revision)
	}
	all := must(bob.Get(ctx, "\x00", clientv3.WithRange("\xff")))(t)
	if len(all.Kvs) != 1 || string(all.Kvs[0].Value) != "bob" || all.Header.Revision != 2 {
		t.Fatalf("bob's range over everything: %v", all.Kvs)
	}
	if n := must(alice.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly()))(t).Count; n != 3 {
		t.Fatalf("alice counts %d keys, want 3", n)
	}
	checkTxn(t, bob)
	checkWatch(t, alice, bob)
	checkLeases(t, alice, bob)
	checkMaintenance(t, e, alice, bob)
}

// checkTxn: compares on keys only another tenant has see them absent.
func checkTxn(t *testing.T, bob *clientv3.Client) {
	ctx := ctxT(t)
	tr := must(bob.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("only-alice"), "=", 0)).
		Then(clientv3.OpPut("bob-txn", "x")).Commit())(t)
	if !tr.Succeeded {
		t.Fatal("bob's txn saw alice's key")
	}
	tr = must(bob.Txn(ctx).If(clientv3.Compare(clientv3.Value("only-alice"), "=", "alice-secret")).Commit())(t)
	if tr.Succeeded {
		t.Fatal("bob's txn compared alice's value")
	}
}

// checkWatch: a watch over the whole keyspace sees its tenant's events
// only, from its tenant's revisions.
func checkWatch(t *testing.T, alice, bob *clientv3.Client) {
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := bob.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(1))
	must(alice.Put(ctx, "while-watching", "alice"))(t)
	last := must(bob.Put(ctx, "bob-last", "x"))(t).Header.Revision
	for seen := int64(0); seen < last; {
		resp, ok := <-w
		if !ok {
			t.Fatal("bob's watch ended")
		}
		for _, ev := range resp.Events {
			if string(ev.Kv.Value) == "alice-secret" || string(ev.Kv.Value) == "alice" {
				t.Fatalf("bob's watch delivered alice's event %q", ev.Kv.Key)
			}
			seen = ev.Kv.ModRevision
		}
	}
}

// checkLeases: a lease ID granted to one tenant does not exist in another.
func checkLeases(t *testing.T, alice, bob *clientv3.Client) {
	ctx := ctxT(t)
	g := must(alice.Grant(ctx, 60))(t)
	ttl := must(bob.TimeToLive(ctx, g.ID))(t)
	if ttl.TTL != -1 {
		t.Fatalf("bob sees alice's lease with TTL %d", ttl.TTL)
	}
	if _, err := bob.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("bob revoking alice's lease: %v", err)
	}
	if _, err := bob.Put(ctx, "k", "v", clientv3.WithLease(g.ID)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("bob attaching alice's lease: %v", err)
	}
	if ls := must(bob.Leases(ctx))(t); len(ls.Leases) != 0 {
		t.Fatalf("bob lists %d leases", len(ls.Leases))
	}
}

// checkMaintenance: compaction, HashKV, Status and Snapshot are per tenant.
func checkMaintenance(t *testing.T, e *env, alice, bob *clientv3.Client) {
	ctx := ctxT(t)
	ep := "https://" + e.addr
	bobHash := must(bob.HashKV(ctx, ep, 0))(t)
	arev := must(alice.Get(ctx, "x"))(t).Header.Revision
	must(alice.Compact(ctx, arev))(t)
	if _, err := bob.Get(ctx, "shared", clientv3.WithRev(2)); err != nil {
		t.Fatalf("alice's compaction reached bob: %v", err)
	}
	if _, err := alice.Get(ctx, "shared", clientv3.WithRev(2)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("alice's own compaction: %v", err)
	}
	must(alice.Put(ctx, "after", "alice-secret"))(t)
	if h := must(bob.HashKV(ctx, ep, 0))(t); h.Hash != bobHash.Hash || h.HashRevision != bobHash.HashRevision {
		t.Fatalf("alice's writes changed bob's HashKV: %+v, was %+v", h, bobHash)
	}
	st := must(bob.Status(ctx, ep))(t)
	if st.Header.Revision != bobHash.Header.Revision || st.DbSize <= 0 {
		t.Fatalf("bob's status: revision %d (want %d), dbSize %d", st.Header.Revision, bobHash.Header.Revision, st.DbSize)
	}
	rc := must(bob.Snapshot(ctx))(t)
	snap := must(io.ReadAll(rc))(t)
	_ = rc.Close()
	if len(snap) == 0 || containsBytes(snap, "alice-secret") {
		t.Fatalf("bob's snapshot (%d bytes) holds alice's values", len(snap))
	}
}

func containsBytes(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return true
		}
	}
	return false
}

// TestUnknownIdentityRefused: a certificate whose Common Name is no
// tenant gets etcd's permission denied, and no tenant is created.
func TestUnknownIdentityRefused(t *testing.T) {
	e := startRouter(t, false)
	ctx := ctxT(t)
	mallory := e.client("mallory")
	if _, err := mallory.Put(ctx, "k", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("unknown tenant's put: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	if _, err := e.router.Registry().Get(ctx, "mallory"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused identity got a tenant: %v", err)
	}
	if n := e.router.Running(); n != 0 {
		t.Fatalf("%d tenant servers running", n)
	}
}

// TestAutoCreate: with AutoCreate an unknown Common Name gets a new tenant.
func TestAutoCreate(t *testing.T) {
	e := startRouter(t, true)
	ctx := ctxT(t)
	r := must(e.client("carol").Put(ctx, "k", "v"))(t)
	if r.Header.Revision != 2 {
		t.Fatalf("carol's first put at %d", r.Header.Revision)
	}
	if _, err := e.router.Registry().Get(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
}

// TestIdleStop: once a tenant's last connection closes and the idle
// timeout passes, its server stops and every goroutine it had ends; the
// next connection starts it again on the same data.
func TestIdleStop(t *testing.T) {
	e := startRouter(t, false)
	e.create("dave")
	ctx := ctxT(t)
	base := runtime.NumGoroutine()
	cli := e.client("dave")
	must(cli.Put(ctx, "k", "v"))(t)
	w := cli.Watch(ctx, "k")
	must(cli.Put(ctx, "k", "v2"))(t)
	<-w
	if e.router.Running() != 1 {
		t.Fatal("no tenant server running")
	}
	_ = cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for e.timers.fire() == 0 || e.router.Running() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("tenant server still running %d", e.router.Running())
		}
		runtime.Gosched()
	}
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after idle stop, %d before the tenant started:\n%s",
				runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	g := must(e.client("dave").Get(ctx, "k"))(t)
	if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "v2" || g.Header.Revision != 3 {
		t.Fatalf("after restart: %v at %d", g.Kvs, g.Header.Revision)
	}
}

// TestDelete: a deleted tenant's connections are refused, its server
// stops, and its data is gone when the name is created again.
func TestDelete(t *testing.T) {
	e := startRouter(t, false)
	e.create("erin", "frank")
	ctx := ctxT(t)
	frank := e.client("frank")
	must(frank.Put(ctx, "k", "frank"))(t)
	erin := e.client("erin")
	must(erin.Put(ctx, "k", "erin"))(t)
	if err := e.router.Registry().Delete(ctx, "erin"); err != nil {
		t.Fatal(err)
	}
	// Its server stops, closing the connection; the client reconnects and
	// is refused.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := erin.Put(ctx, "k", "again")
		if errors.Is(err, rpctypes.ErrPermissionDenied) {
			break
		}
		if err == nil {
			t.Fatal("a deleted tenant's open connection still writes")
		}
		if time.Now().After(deadline) {
			t.Fatalf("deleted tenant's open connection not refused: %v", err)
		}
	}
	if _, err := e.client("erin").Get(ctx, "k"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("new connection of a deleted tenant: %v", err)
	}
	e.create("erin")
	g := must(e.client("erin").Get(ctx, "k"))(t)
	if len(g.Kvs) != 0 || g.Header.Revision != 1 {
		t.Fatalf("re-created tenant sees %v at revision %d", g.Kvs, g.Header.Revision)
	}
	if g := must(frank.Get(ctx, "k"))(t); len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "frank" {
		t.Fatalf("deleting erin touched frank: %v", g.Kvs)
	}
}

// TestQuotaPerTenant: a tenant's own byte quota refuses its writes with
// etcd's "database space exceeded" and raises NOSPACE in that tenant only.
func TestQuotaPerTenant(t *testing.T) {
	e := startRouter(t, false)
	ctx := ctxT(t)
	if _, err := e.router.Registry().Create(ctx, "small", 64<<10); err != nil {
		t.Fatal(err)
	}
	e.create("roomy")
	small, roomy := e.client("small"), e.client("roomy")
	if st := must(small.Status(ctx, "https://"+e.addr))(t); st.DbSizeQuota != 64<<10 {
		t.Fatalf("small's quota %d", st.DbSizeQuota)
	}
	value := string(make([]byte, 4<<10))
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		_, err := small.Put(ctx, fmt.Sprintf("k%d", i), value)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d puts of 4 KiB never exceeded a 64 KiB quota", i)
		}
	}
	if al := must(small.AlarmList(ctx))(t); len(al.Alarms) != 1 {
		t.Fatalf("small's alarms: %v", al.Alarms)
	}
	if al := must(roomy.AlarmList(ctx))(t); len(al.Alarms) != 0 {
		t.Fatalf("small's NOSPACE reached roomy: %v", al.Alarms)
	}
	must(roomy.Put(ctx, "k", value))(t)
}
