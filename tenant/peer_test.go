package tenant

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/metadata"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// replicaCN is the Common Name of the certificate the test's replicas
// serve with and present to each other.
const replicaCN = "fdb-etcd-replica"

// replicas is n routers over one store, each a replica that forwards its
// tenants' writes to their owners.
type replicas struct {
	env     // the first replica's, for clients and certificates
	routers []*Router
	addrs   []string
	files   tlstest.Files
}

func startReplicas(t *testing.T, n int) *replicas {
	ca := tlstest.NewCA(t, "tenant-replicas-ca")
	files := tlstest.Write(t, t.TempDir(), ca.Server(t, replicaCN), ca)
	db := testdb.Open(t)
	rs := &replicas{files: files}
	for i := range n {
		r, addr := startReplica(t, db, files, fmt.Sprintf("replica-%d", i))
		rs.routers, rs.addrs = append(rs.routers, r), append(rs.addrs, addr)
	}
	rs.env = env{t: t, ca: ca, addr: rs.addrs[0], router: rs.routers[0], db: db, timers: &idleTimers{}}
	return rs
}

// startReplica serves one replica's router on loopback; its peers reach it
// at the address it listens on.
func startReplica(t *testing.T, db storage.DB, files tlstest.Files, name string) (*Router, string) {
	rl, err := tlsconfig.New(tlsconfig.Config{CertFile: files.Cert, KeyFile: files.Key,
		TrustedCAFile: files.CA, ClientCertAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sc := server.Config{Name: name, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), ForwardWrites: true,
		AdvertiseClientURLs: []url.URL{{Scheme: "https", Host: l.Addr().String()}}}
	timers := &idleTimers{} // never fired: tenants keep running
	r, err := NewRouter(Config{Server: sc, TLS: rl.ServerConfig(), PeerTLS: rl.ClientConfig,
		AfterFunc: timers.AfterFunc, Logger: sc.Logger, Members: replicaMembers(t, db, name, l.Addr().String())}, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Serve(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, l.Addr().String()
}

// clientAt dials replica i with cert; it closes when the test ends.
func (rs *replicas) clientAt(i int, cert tls.Certificate) *clientv3.Client {
	rs.t.Helper()
	e := rs.env
	e.addr = rs.addrs[i]
	cli := e.dial(cert)
	rs.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// tenantMetric sums the series of tenant's server on r that series
// matches, or is -1 if the tenant's server does not run there.
func tenantMetric(t *testing.T, r *Router, tenant string, series *regexp.Regexp) int {
	t.Helper()
	r.mu.Lock()
	inst := r.tenants[tenant]
	r.mu.Unlock()
	if inst == nil {
		return -1
	}
	<-inst.ready
	rec := httptest.NewRecorder()
	inst.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	n := 0
	for _, m := range series.FindAllStringSubmatch(rec.Body.String(), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

var (
	forwardedSeries = regexp.MustCompile(`(?m)^fdb_etcd_forward_writes_total\{result="\w+"\} (\d+)$`)
	feedSeries      = regexp.MustCompile(`(?m)^fdb_etcd_commit_feed_revision (\d+)$`)
)

// forwardedWrites is how many writes tenant's server on r forwarded (any
// outcome), or -1 if it does not run there.
func forwardedWrites(t *testing.T, r *Router, tenant string) int {
	return tenantMetric(t, r, tenant, forwardedSeries)
}

// TestForwardedTenantWrites: three replicas, two tenants, every client
// writing through every replica at once. Each tenant's writes go to that
// tenant's owner replica (the other two forward, the owner does not), the
// tenant's revisions stay dense, and nothing crosses between tenants.
func TestForwardedTenantWrites(t *testing.T) {
	rs := startReplicas(t, 3)
	tenants := []string{"alice", "bob"}
	rs.create(tenants...)
	const perClient = 20
	var wg sync.WaitGroup
	errs := make(chan error, len(tenants)*len(rs.addrs))
	for _, name := range tenants {
		for i := range rs.addrs {
			cli := rs.clientAt(i, rs.clientCert(name))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range perClient {
					if _, err := cli.Put(ctxT(t), fmt.Sprintf("k-%d-%02d", i, j), name); err != nil {
						errs <- fmt.Errorf("%s's put %d through replica %d: %w", name, j, i, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, name := range tenants {
		checkDense(t, rs.clientAt(0, rs.clientCert(name)), name, len(rs.addrs)*perClient)
		var owners, forwarders int
		for i, r := range rs.routers {
			switch n := forwardedWrites(t, r, name); {
			case n == 0:
				owners++
			case n > 0:
				forwarders++
			default:
				t.Fatalf("%s has no server on replica %d", name, i)
			}
		}
		if owners != 1 || forwarders != len(rs.routers)-1 {
			t.Fatalf("%s: %d replicas forwarded nothing, %d forwarded; want one owner and %d forwarding",
				name, owners, forwarders, len(rs.routers)-1)
		}
		// The replicas that forward follow the tenant's commits on its
		// owner (server/commitfeed), through the peer port.
		head := len(rs.addrs)*perClient + 1
		for i, r := range rs.routers {
			if forwardedWrites(t, r, name) == 0 {
				continue
			}
			deadline := time.Now().Add(10 * time.Second)
			for tenantMetric(t, r, name, feedSeries) < head {
				if time.Now().After(deadline) {
					t.Fatalf("%s on replica %d: the owner's commit feed reported revision %d, want %d",
						name, i, tenantMetric(t, r, name, feedSeries), head)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// checkDense: tenant name's keys are its n puts, its own values only, at
// revisions 2..n+1 exactly.
func checkDense(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	all := must(cli.Get(ctxT(t), "\x00", clientv3.WithFromKey()))(t)
	if len(all.Kvs) != n || all.Header.Revision != int64(n+1) {
		t.Fatalf("%s: %d keys at revision %d, want %d at %d", name, len(all.Kvs), all.Header.Revision, n, n+1)
	}
	seen := map[int64]bool{}
	for _, kv := range all.Kvs {
		if string(kv.Value) != name || kv.ModRevision < 2 || kv.ModRevision > int64(n+1) || seen[kv.ModRevision] {
			t.Fatalf("%s: key %q = %q at revision %d", name, kv.Key, kv.Value, kv.ModRevision)
		}
		seen[kv.ModRevision] = true
	}
}

// TestTenantTagOnlyFromPeers: the tenant a request names counts only on a
// peer's connection. A tenant's client naming another tenant writes in its
// own keyspace; a peer naming none is refused; a peer naming one writes
// there.
func TestTenantTagOnlyFromPeers(t *testing.T) {
	rs := startReplicas(t, 1)
	rs.create("alice", "bob")
	bobRec := must(rs.router.Registry().Get(ctxT(t), "bob"))(t)
	spoof := metadata.AppendToOutgoingContext(ctxT(t), "fdb-etcd-forwarded", "1", "fdb-etcd-tenant", tenantTag(bobRec))
	alice, bob := rs.client("alice"), rs.client("bob")
	must(alice.Put(spoof, "spoofed", "alice"))(t)
	if n := must(bob.Get(ctxT(t), "spoofed"))(t).Count; n != 0 {
		t.Fatal("alice's client wrote into bob's keyspace by naming bob")
	}
	if n := must(alice.Get(ctxT(t), "spoofed"))(t).Count; n != 1 {
		t.Fatal("alice's put is not in alice's keyspace")
	}

	peerCert := must(tls.LoadX509KeyPair(rs.files.Cert, rs.files.Key))(t)
	peer := rs.clientAt(0, peerCert)
	if _, err := peer.Put(ctxT(t), "k", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("a peer's put naming no tenant: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
	must(peer.Put(spoof, "from-peer", "bob"))(t)
	if n := must(bob.Get(ctxT(t), "from-peer"))(t).Count; n != 1 {
		t.Fatal("a peer's put naming bob is not in bob's keyspace")
	}
	stale := metadata.AppendToOutgoingContext(ctxT(t), "fdb-etcd-forwarded", "1", "fdb-etcd-tenant",
		tenantTag(Record{ID: bobRec.ID + 100, Name: "bob"}))
	if _, err := peer.Put(stale, "stale", "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("a peer's put naming a deleted id of bob: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}
}

// TestTenantMembersAreTheReplicas: a tenant's MemberList lists every live
// replica, whether or not the tenant runs there, each under the member id
// that tenant's server on it answers with.
func TestTenantMembersAreTheReplicas(t *testing.T) {
	rs := startReplicas(t, 3)
	rs.create("alice")
	cert := rs.clientCert("alice")
	ml := must(rs.clientAt(0, cert).MemberList(ctxT(t)))(t)
	if len(ml.Members) != len(rs.addrs) {
		t.Fatalf("alice's MemberList on replica 0 lists %d members, want the %d replicas: %v", len(ml.Members), len(rs.addrs), ml.Members)
	}
	for i, addr := range rs.addrs {
		st := must(rs.clientAt(i, cert).Status(ctxT(t), "https://"+addr))(t)
		listed := false
		for _, m := range ml.Members {
			listed = listed || (m.ID == st.Header.MemberId && m.Name == fmt.Sprintf("replica-%d", i) && m.ClientURLs[0] == "https://"+addr)
		}
		if !listed {
			t.Errorf("replica %d answers alice as member %x, not listed: %v", i, st.Header.MemberId, ml.Members)
		}
	}
}
