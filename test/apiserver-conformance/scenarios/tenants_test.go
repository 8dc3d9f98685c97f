package scenarios

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// envTenants=0 skips TestTenantsShareStore.
const envTenants = "CONFORMANCE_TENANTS"

// tenantNames are the Common Names of the two kube-apiservers' etcd client
// certificates, and so their tenants.
var tenantNames = [2]string{"tenant-a", "tenant-b"}

// clientCert is an etcd client certificate and the CA that verifies the
// server (kube-apiserver's --etcd-cafile, --etcd-certfile, --etcd-keyfile).
type clientCert struct {
	caFile, certFile, keyFile string
}

// TestTenantsShareStore runs two kube-apiservers, each with the etcd client
// certificate of its own tenant, on one fdb-etcd with
// --tenancy=client-cert-cn (and on three replicas on FoundationDB when that
// half runs). Both run the scenarios at the same time, with the same
// namespaces and object names; then neither apiserver, nor a raw etcd
// client of its tenant, may see an object the other created, and each
// apiserver's watch-cache consistency checker must be clean. It runs beside
// TestScenarios, once that test's busy scenarios are done (busyStacks).
func TestTenantsShareStore(t *testing.T) {
	if os.Getenv(envTenants) == "0" {
		t.Skipf("%s=0", envTenants)
	}
	if _, err := fdbetcd.Binary(); err != nil {
		t.Fatal(err)
	}
	t.Parallel()
	busyStacks.Wait()
	for _, be := range stores() {
		if be == storeEtcd {
			continue // etcd has no tenants
		}
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			t.Cleanup(func() {
				status := "PASS"
				if t.Failed() {
					status = "FAIL"
				}
				recordScenario("TwoTenants", be, status, time.Since(start))
			})
			runTenants(t, be)
		})
	}
}

func runTenants(t *testing.T, be string) {
	dir, err := os.MkdirTemp("", "conformance-tenants-"+be+"-")
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]*cluster
	shared, certs := startTenantStore(t, dir, be)
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.stop()
			}
		}
		shared.stop()
		if t.Failed() || *flagKeep {
			t.Logf("logs and data kept in %s", dir)
			for i, c := range cs {
				if c != nil && c.apiserver != nil {
					t.Logf("kube-apiserver of %s, log tail:\n%s", tenantNames[i], tail(c.apiserver.log(), 3000))
				}
			}
			t.Logf("fdb-etcd log tail:\n%s", tail(shared.logs(), 6000))
			return
		}
		os.RemoveAll(dir)
	})
	startTenantClusters(t, shared, certs, dir, be, &cs)
	marks := createMarkers(t, cs)
	t.Run("IsolatedAtStart", func(t *testing.T) { checkIsolation(t, cs, marks) })
	t.Run("Scenarios", func(t *testing.T) {
		for i, c := range cs {
			t.Run(tenantNames[i], func(t *testing.T) {
				t.Parallel()
				runTenantScenarios(t, c)
			})
		}
	})
	t.Run("IsolatedAfterScenarios", func(t *testing.T) { checkIsolation(t, cs, marks) })
	if be == storeFDB {
		t.Run("WritesForwarded", func(t *testing.T) { checkForwarded(t, shared, certs) })
	}
	t.Run("MasterleasesExpireAfterStop", func(t *testing.T) {
		for i, c := range cs {
			t.Run(tenantNames[i], func(t *testing.T) {
				t.Parallel()
				scenarioMasterleases(t, c)
			})
		}
	})
}

// runTenantScenarios runs the scenarios on one tenant's apiserver, but for
// StoreRestart, which would restart the servers under the other tenant's
// scenarios too, and MasterleasesExpireAfterStop, which kills the
// apiserver and runs after the last isolation check.
func runTenantScenarios(t *testing.T, c *cluster) {
	for _, sc := range scenarios() {
		if sc.name == "StoreRestart" || sc.name == "MasterleasesExpireAfterStop" {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			if c.apiserver.exited() && sc.name != "ConsistencyChecker" {
				t.Fatalf("kube-apiserver is not running: %v", c.apiserver.err)
			}
			sc.run(t, c)
		})
	}
}

// tenantStore is fdb-etcd serving tenants: one server on its embedded
// store, or fdbReplicas replicas on FoundationDB.
type tenantStore struct {
	urls []string
	stop func()
	logs func() string
	tls  *fdbetcd.TLS
}

// startTenantStore writes the certificates (the server's and one client
// certificate per tenant) and starts fdb-etcd with --tenancy=client-cert-cn.
// Tenants are created by their first connection (--tenant-auto-create).
func startTenantStore(t *testing.T, dir, be string) (*tenantStore, [2]*clientCert) {
	t.Helper()
	srvTLS, certs, err := writeTenantPKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatalf("tenant certificates: %v", err)
	}
	opts := fdbetcd.Options{
		ProgressNotifyInterval: progressNotifyInterval,
		DataDir:                filepath.Join(dir, "fdb-etcd.data"),
		LogPath:                filepath.Join(dir, "fdb-etcd.log"),
		TLS:                    srvTLS,
		Args:                   []string{"--tenancy=client-cert-cn", "--tenant-auto-create"},
	}
	if be == storeEmbedded {
		s, err := fdbetcd.Start(opts)
		if err != nil {
			t.Fatalf("starting fdb-etcd with tenants: %v", err)
		}
		return &tenantStore{urls: []string{s.URL}, stop: s.Stop, tls: srvTLS, logs: func() string {
			b, _ := os.ReadFile(opts.LogPath)
			return string(b)
		}}, certs
	}
	opts.LogPath = ""
	r, err := fdbetcd.StartReplicas(fdbCluster, fdbReplicas, opts)
	if err != nil {
		t.Fatalf("starting %d fdb-etcd replicas with tenants: %v", fdbReplicas, err)
	}
	return &tenantStore{urls: r.URLs(), stop: r.Stop, tls: srvTLS, logs: func() string { return r.Logs(4000) }}, certs
}

// checkForwarded: the replicas that do not own a tenant's writes sent them
// to the one that does. A replica that commits them itself still answers
// correctly, so nothing else here fails when forwarding does; but its
// commits conflict with the owner's on the tenant's head revision, and
// under load time out (this test ran that way, unnoticed, while its PKI
// gave the replicas a certificate they could not present to each other).
func checkForwarded(t *testing.T, ts *tenantStore, certs [2]*clientCert) {
	for i, cert := range certs {
		var ok, local float64
		for _, u := range ts.urls {
			m, err := ts.metrics(u, cert)
			if err != nil {
				t.Fatalf("%s's metrics at %s: %v", tenantNames[i], u, err)
			}
			ok += metricSum(m, "fdb_etcd_forward_writes_total", `result="ok"`)
			local += metricSum(m, "fdb_etcd_forward_writes_total", `result="local"`)
		}
		t.Logf("%s: %.0f writes forwarded to the owner, %.0f committed by a replica that could not reach it", tenantNames[i], ok, local)
		// A connection can drop under load and its writes then commit
		// locally until it is back: a few, not a share.
		if ok == 0 || local > 0.01*(ok+local) {
			t.Errorf("%s: the replicas forwarded %.0f writes and committed %.0f themselves; want nearly all forwarded", tenantNames[i], ok, local)
		}
	}
}

// metrics returns the /metrics text of the fdb-etcd at url as cert's
// tenant sees it.
func (ts *tenantStore) metrics(url string, cert *clientCert) (string, error) {
	cfg, err := ts.tls.ClientConfig(cert.certFile, cert.keyFile)
	if err != nil {
		return "", err
	}
	cfg.NextProtos = []string{"http/1.1"}
	cl := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(url + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

// tenantClient is a raw etcd client of one tenant (its certificate).
func (ts *tenantStore) tenantClient(cert *clientCert) (*clientv3.Client, error) {
	cfg, err := ts.tls.ClientConfig(cert.certFile, cert.keyFile)
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: ts.urls, DialTimeout: 10 * time.Second, TLS: cfg, Logger: zap.NewNop()})
}

// startTenantClusters starts the two tenants' kube-apiservers at once,
// into cs (which the caller's cleanup stops, also after a failed start).
func startTenantClusters(t *testing.T, ts *tenantStore, certs [2]*clientCert, dir, be string, cs *[2]*cluster) {
	t.Helper()
	var (
		errs [2]error
		wg   sync.WaitGroup
	)
	for i := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[i], errs[i] = startTenantCluster(t, ts, certs[i], filepath.Join(dir, tenantNames[i]), be+"/"+tenantNames[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("kube-apiserver of %s: %v", tenantNames[i], err)
		}
	}
}

// startTenantCluster starts one kube-apiserver connecting as cert's
// tenant; the cluster's store is that tenant's view of ts.
func startTenantCluster(t *testing.T, ts *tenantStore, cert *clientCert, dir, name string) (*cluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cli, err := ts.tenantClient(cert)
	if err != nil {
		return nil, err
	}
	st := &store{name: name, urls: ts.urls, client: cli, cert: cert, logs: ts.logs, stop: func() { cli.Close() }}
	c, err := startCluster(t, st, dir)
	t.Cleanup(st.stop)
	return c, err
}

// writeTenantPKI writes an etcd CA, fdb-etcd's serving certificate for
// 127.0.0.1 and a client certificate for each tenant into dir.
func writeTenantPKI(dir string) (*fdbetcd.TLS, [2]*clientCert, error) {
	var certs [2]*clientCert
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, certs, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, certs, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "conformance-etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, certs, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	caFile := filepath.Join(dir, "etcd-ca.crt")
	if err := writePEM(caFile, "CERTIFICATE", caDER); err != nil {
		return nil, certs, err
	}
	srv := &fdbetcd.TLS{CAFile: caFile}
	// The replicas also present their serving certificate to each other when
	// they forward writes to the owner (docs/operations.md): without client
	// auth every replica commits its tenants' writes itself, and under load
	// their batches conflict on each tenant's head until they time out.
	srv.CertFile, srv.KeyFile, err = issueCert(dir, "fdb-etcd", ca, caKey, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, certs, err
	}
	for i, cn := range tenantNames {
		certs[i] = &clientCert{caFile: caFile}
		if certs[i].certFile, certs[i].keyFile, err = issueCert(dir, cn, ca, caKey, x509.ExtKeyUsageClientAuth); err != nil {
			return nil, certs, err
		}
	}
	// The servers' readiness probe connects as the first tenant.
	srv.ProbeCertFile, srv.ProbeKeyFile = certs[0].certFile, certs[0].keyFile
	return srv, certs, nil
}

// issueCert writes a certificate for cn (with 127.0.0.1 and localhost as
// its addresses, for the given usages) signed by ca, and its key, as
// dir/cn.crt and dir/cn.key.
func issueCert(dir, cn string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage ...x509.ExtKeyUsage) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", keyDER)
}
