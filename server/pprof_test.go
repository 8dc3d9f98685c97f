package server_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

// mtlsServer starts a server whose client port requires client certificates
// and whose metrics listener is plain HTTP, as the manifests deploy it. It
// returns the client URL, the metrics URL and a client certificate config.
func mtlsServer(t *testing.T, cfg server.Config) (clientURL, metricsURL string, good *tls.Config, ca *tlstest.CA) {
	t.Helper()
	ca = tlstest.NewCA(t, "etcd-ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "fdb-etcd"), ca)
	cfg.TLS = tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ClientCertAuth: true, ReloadInterval: -1}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "https", Host: l.Addr().String()}
	cfg.ListenClientURLs, cfg.AdvertiseClientURLs = []url.URL{u}, []url.URL{u}
	cfg.Logger = zap.NewNop()
	srv, err := server.New(cfg, testdb.Open(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.ServeTLSListener(l); err != nil {
		t.Fatal(err)
	}
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.ServeMetricsListener(ml)
	good = &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "operator").TLS(t)}}
	return u.String(), "http://" + ml.Addr().String(), good, ca
}

func httpGet(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func tlsHTTPClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

// TestPprofOnlyOnClientPort: etcd serves --enable-pprof's profiles on its
// client listeners only. The metrics listener is plain HTTP without client
// certificates (http://0.0.0.0:2381 in the manifests), so profiles there
// would hand heap dumps and command lines to anyone who reaches the port.
func TestPprofOnlyOnClientPort(t *testing.T) {
	clientURL, metricsURL, good, ca := mtlsServer(t, server.Config{EnablePprof: true})
	plain := &http.Client{Timeout: 30 * time.Second}

	for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap"} {
		if code, body := httpGet(t, plain, metricsURL+p); code != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d %.80q, want 404", p, code, body)
		}
	}
	if code, _ := httpGet(t, plain, metricsURL+"/metrics"); code != http.StatusOK {
		t.Errorf("metrics listener /metrics: %d", code)
	}

	certified := tlsHTTPClient(good)
	if code, body := httpGet(t, certified, clientURL+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("client port /debug/pprof/ with a client certificate: %d %.80q", code, body)
	}
	if code, body := httpGet(t, certified, clientURL+"/debug/pprof/cmdline"); code != http.StatusOK || body == "" {
		t.Errorf("client port /debug/pprof/cmdline: %d %q", code, body)
	}
	// Without a client certificate the handshake is refused.
	if _, err := tlsHTTPClient(&tls.Config{RootCAs: ca.Pool()}).Get(clientURL + "/debug/pprof/"); err == nil {
		t.Error("client port served /debug/pprof/ to a client without a certificate")
	}
}

// TestPprofOffByDefault: no profiles anywhere without --enable-pprof.
func TestPprofOffByDefault(t *testing.T) {
	clientURL, metricsURL, good, _ := mtlsServer(t, server.Config{})
	if code, _ := httpGet(t, &http.Client{Timeout: 30 * time.Second}, metricsURL+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("metrics listener /debug/pprof/: %d, want 404", code)
	}
	if code, _ := httpGet(t, tlsHTTPClient(good), clientURL+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("client port /debug/pprof/: %d, want 404", code)
	}
}
