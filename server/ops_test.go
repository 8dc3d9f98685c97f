package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// tlsServer starts a server whose client port speaks TLS with the given
// configuration, and returns its https URL.
func tlsServer(t *testing.T, tc tlsconfig.Config) (*server.Server, string) {
	t.Helper()
	db, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "https", Host: l.Addr().String()}
	tc.ReloadInterval = -1
	srv, err := server.New(server.Config{
		ListenClientURLs:    []url.URL{u},
		AdvertiseClientURLs: []url.URL{u},
		TLS:                 tc,
		Logger:              zap.NewNop(),
	}, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ServeTLSListener(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv, u.String()
}

func tlsClient(t *testing.T, endpoint string, cfg *tls.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		TLS:         cfg,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func TestTLSClientCertAuth(t *testing.T) {
	ca := tlstest.NewCA(t, "etcd-ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "fdb-etcd"), ca)
	_, endpoint := tlsServer(t, tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ClientCertAuth: true})

	good := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "kube-apiserver").TLS(t)}}
	cli := tlsClient(t, endpoint, good)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/registry/a", "1"); err != nil {
		t.Fatalf("put with a trusted client certificate: %v", err)
	}
	resp, err := cli.Get(ctx, "/registry/a")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
		t.Fatalf("get: %v %v", resp, err)
	}

	// HTTP/1.1 on the same TLS port: etcd's /health body.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: good, ForceAttemptHTTP2: true}}
	hr, err := hc.Get(endpoint + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if hr.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"health":"true","reason":""}` {
		t.Fatalf("/health over TLS: %d %s", hr.StatusCode, body)
	}

	other := tlstest.NewCA(t, "other-ca")
	for name, cfg := range map[string]*tls.Config{
		"no certificate":           {RootCAs: ca.Pool()},
		"certificate of other CA":  {RootCAs: ca.Pool(), Certificates: []tls.Certificate{other.Client(t, "intruder").TLS(t)}},
		"plain text to TLS server": nil,
	} {
		ep := endpoint
		if cfg == nil {
			ep = strings.Replace(endpoint, "https://", "http://", 1)
		}
		bad := tlsClient(t, ep, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := bad.Get(ctx, "/registry/a")
		cancel()
		if err == nil {
			t.Errorf("%s: request succeeded", name)
		}
	}
	// The refusal happens at the handshake.
	c, err := tls.Dial("tcp", strings.TrimPrefix(endpoint, "https://"), &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}})
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("handshake without a client certificate: %v, want a certificate alert", err)
	}
}

func TestTLSCertificateRotationKeepsConnections(t *testing.T) {
	ca := tlstest.NewCA(t, "etcd-ca")
	dir := t.TempDir()
	f := tlstest.Write(t, dir, ca.Server(t, "first"), ca)
	_, endpoint := tlsServer(t, tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ClientCertAuth: true})
	clientCfg := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "client").TLS(t)}}

	cli := tlsClient(t, endpoint, clientCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, "/w") // a long-lived stream, if the watch service exists
	_ = wch
	if _, err := cli.Put(ctx, "k", "before"); err != nil {
		t.Fatal(err)
	}

	tlstest.Write(t, dir, ca.Server(t, "second"), ca)

	served := func() string {
		c, err := tls.Dial("tcp", strings.TrimPrefix(endpoint, "https://"), clientCfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "second" {
		t.Fatalf("new connections see %q after rotation, want second", got)
	}
	// The client's existing connection keeps working.
	if _, err := cli.Put(ctx, "k", "after"); err != nil {
		t.Fatalf("existing connection after rotation: %v", err)
	}
	// And a new client trusts the new certificate.
	cli2 := tlsClient(t, endpoint, clientCfg)
	resp, err := cli2.Get(ctx, "k")
	if err != nil || string(resp.Kvs[0].Value) != "after" {
		t.Fatalf("new client after rotation: %v %v", resp, err)
	}
}

func TestHTTPSWithoutCertificateRefused(t *testing.T) {
	db, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = server.New(server.Config{ListenClientURLs: []url.URL{{Scheme: "https", Host: "127.0.0.1:0"}}}, db)
	if err == nil {
		t.Fatal("https listen URL without a certificate accepted")
	}
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// metricLine finds the sample line of name with all the given label pairs.
func metricValue(text, name string, labels ...string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if ok {
			return line[strings.LastIndexByte(line, ' ')+1:], true
		}
	}
	return "", false
}

func metricsServer(t *testing.T, cfg server.Config) (*testserver.Server, string) {
	t.Helper()
	ts := testserver.Start(t, testserver.Options{Config: cfg})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.ServeMetricsListener(l)
	return ts, "http://" + l.Addr().String()
}

func TestMetricsEndpoint(t *testing.T) {
	ts, base := metricsServer(t, server.Config{})
	ctx := context.Background()
	cli := ts.Client
	if _, err := cli.Put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Get(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "nope"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("a"), "=", 1)).
		Then(clientv3.OpPut("b", "2"), clientv3.OpGet("a")).Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Get(ctx, "a", clientv3.WithRev(1000)); err == nil {
		t.Fatal("future revision accepted")
	}
	text := scrape(t, base)
	want := []struct {
		name   string
		labels []string
		value  string // "" means any
	}{
		{"grpc_server_started_total", []string{`grpc_method="Range"`, `grpc_service="etcdserverpb.KV"`, `grpc_type="unary"`}, "2"},
		{"grpc_server_handled_total", []string{`grpc_method="Range"`, `grpc_code="OK"`}, "1"},
		{"grpc_server_handled_total", []string{`grpc_method="Range"`, `grpc_code="OutOfRange"`}, "1"},
		{"grpc_server_handled_total", []string{`grpc_method="Compact"`, `grpc_code="OK"`}, "0"},
		{"grpc_server_handling_seconds_count", []string{`grpc_method="Put"`}, "1"},
		{"grpc_server_msg_sent_total", []string{`grpc_method="Put"`}, "1"},
		{"etcd_mvcc_put_total", nil, "2"},
		{"etcd_mvcc_range_total", nil, "2"}, // the Get and the Txn's Get
		{"etcd_mvcc_delete_total", nil, "1"},
		{"etcd_mvcc_txn_total", nil, "1"},
		{"etcd_server_has_leader", nil, "1"},
		{"etcd_server_is_leader", nil, "1"},
		{"etcd_server_version", []string{`server_version="3.6.16"`}, "1"},
		{"etcd_cluster_version", []string{`cluster_version="3.6"`}, "1"},
		{"etcd_debugging_mvcc_current_revision", nil, "3"},
		{"etcd_debugging_mvcc_compact_revision", nil, "0"},
		{"fdb_etcd_revision", nil, "3"},
		{"etcd_mvcc_db_total_size_in_bytes", nil, ""},
		{"fdb_etcd_revision_batch_requests_count", nil, ""},
		{"fdb_etcd_storage_transaction_duration_seconds_count", []string{`kind="update"`, `result="ok"`}, ""},
		{"fdb_etcd_storage_transaction_retries_total", []string{`kind="update"`}, "0"},
		{"fdb_etcd_storage_conflicts_total", nil, "0"},
		{"fdb_etcd_storage_commit_unknown_results_total", nil, "0"},
		{"go_goroutines", nil, ""},
		{"process_open_fds", nil, ""},
	}
	for _, w := range want {
		got, ok := metricValue(text, w.name, w.labels...)
		if !ok {
			t.Errorf("%s%v missing", w.name, w.labels)
			continue
		}
		if w.value != "" && got != w.value {
			t.Errorf("%s%v = %s, want %s", w.name, w.labels, got, w.value)
		}
	}
	if t.Failed() {
		t.Log(text)
	}

	// The metrics listener also serves the health endpoints.
	for path, want := range map[string]string{"/health": `{"health":"true","reason":""}`, "/livez": "ok", "/readyz": "ok"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s on the metrics listener: %d %q", path, resp.StatusCode, b)
		}
	}

	// etcd serves /metrics on its client port too; scrapers set up for etcd
	// expect it there.
	if got, ok := metricValue(scrape(t, ts.Addr), "etcd_mvcc_put_total"); !ok || got != "2" {
		t.Errorf("etcd_mvcc_put_total on the client port = %q, %v; want 2", got, ok)
	}
}

func TestReadyCheckHook(t *testing.T) {
	ts, base := metricsServer(t, server.Config{})
	var lagging atomic.Bool
	lagging.Store(true)
	ts.AddReadyCheck("watch hub", func(context.Context) error {
		if lagging.Load() {
			return errors.New("behind the revision log")
		}
		return nil
	})
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "watch hub") {
		t.Fatalf("/readyz while a check fails: %d %q", code, body)
	}
	if code, _ := get("/livez"); code != 200 {
		t.Fatalf("/livez while not ready: %d", code)
	}
	// The client port answers the same.
	resp, err := http.Get(ts.Addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("/readyz on the client port: %d", resp.StatusCode)
	}
	lagging.Store(false)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after the check passes: %d", code)
	}
	var h struct{ Health, Reason string }
	_, body := get("/health")
	if err := json.Unmarshal([]byte(body), &h); err != nil || h.Health != "true" {
		t.Fatalf("/health: %q %v", body, err)
	}
}

func TestSlowRequestLog(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ts := testserver.Start(t, testserver.Options{Config: server.Config{Logger: zap.New(core), WarningApplyDuration: time.Nanosecond}})
	if _, err := ts.Client.Put(context.Background(), "/registry/pods/default/p", "v"); err != nil {
		t.Fatal(err)
	}
	slow := logs.FilterMessage("request took too long").All()
	if len(slow) != 1 {
		t.Fatalf("%d slow-request lines, want 1: %v", len(slow), logs.All())
	}
	f := slow[0].ContextMap()
	if slow[0].Level != zapcore.WarnLevel || f["method"] != "/etcdserverpb.KV/Put" ||
		!strings.Contains(f["request"].(string), `key:"/registry/pods/default/p" value_size:1`) ||
		!strings.Contains(f["response"].(string), "revision:2") {
		t.Fatalf("slow-request line: %v %v", slow[0].Level, f)
	}

	core2, logs2 := observer.New(zapcore.InfoLevel)
	ts2 := testserver.Start(t, testserver.Options{Config: server.Config{Logger: zap.New(core2)}})
	for i := 0; i < 20; i++ {
		if _, err := ts2.Client.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range logs2.All() {
		if strings.Contains(e.Message, "request") {
			t.Fatalf("per-request log at info with the default threshold: %v", e)
		}
	}
}

func TestShutdownHooksRunBeforeDrain(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	ran := make(chan struct{})
	ts.OnShutdown(func() { close(ran) })
	ts.Stop()
	select {
	case <-ran:
	default:
		t.Fatal("shutdown hook did not run")
	}
}
