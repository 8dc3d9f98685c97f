package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

func TestTenantAdminFlags(t *testing.T) {
	tlsArgs := []string{"--listen-client-urls", "https://127.0.0.1:2379", "--cert-file", "c", "--key-file", "k",
		"--trusted-ca-file", "ca", "--tenancy", "client-cert-cn", "--client-cert-auth"}
	for _, bad := range [][]string{
		{"--tenant-admin-cn", "ops"},
		append([]string{"--tenant-admin-cn", "ops,"}, tlsArgs...),
		append([]string{"--tenant-metrics-limit", "-1"}, tlsArgs...),
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	c, err := parseFlags(append([]string{"--tenant-admin-cn", "ops,oncall", "--tenant-admin-cn", "sre", "--tenant-metrics-limit", "7"}, tlsArgs...))
	if err != nil || !slices.Equal(c.etcd.TenantAdminCNs, []string{"ops", "oncall", "sre"}) || c.etcd.TenantMetricsLimit != 7 {
		t.Fatalf("parsed %+v: %v", c.etcd.fdbEtcdConfig, err)
	}
	if c, err := parseFlags(tlsArgs); err != nil || c.etcd.TenantMetricsLimit != 100 || len(c.etcd.TenantAdminCNs) != 0 {
		t.Fatalf("defaults %+v: %v", c.etcd.fdbEtcdConfig, err)
	}
	data := filepath.Join(t.TempDir(), "data")
	if _, err := tenantCmd(t, "create", "a", "--data-dir", data, "--quota-keys", "3", "--quota-watchers", "4"); err != nil {
		t.Fatal(err)
	}
	if _, err := tenantCmd(t, "set-quota", "a", "--data-dir", data); err == nil {
		t.Fatal("set-quota without a quota accepted")
	}
	out, err := tenantCmd(t, "set-quota", "a", "--data-dir", data, "--quota-requests-per-second", "2.5")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || len(lines) != 2 ||
		!slices.Equal(strings.Fields(lines[1]), []string{"a", "1", "0", "3", "2.5", "0", "4"}) {
		t.Fatalf("set-quota keeps the quotas not given: %v\n%s", err, out)
	}
	if _, err := tenantCmd(t, "set-quota", "a", "--data-dir", data, "--quota-keys", "-2"); err == nil || !strings.Contains(err.Error(), "invalid quota") {
		t.Fatalf("a negative key quota: %v", err)
	}
}

// TestTenantAdminEndpoint runs the binary with an admin Common Name: the
// CLI administers tenants through it with the admin's certificate and not
// with a tenant's, set-quota reaches the running tenant, and /metrics
// carries the tenants up to --tenant-metrics-limit.
func TestTenantAdminEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	data := filepath.Join(t.TempDir(), "data")
	bin := buildBinary(t)
	ca := tlstest.NewCA(t, "tenants-ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "fdb-etcd-0"), ca)
	client, metricsAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--data-dir", data, "--tenancy", "client-cert-cn", "--tenant-admin-cn", "ops",
		"--tenant-metrics-limit", "1",
		"--listen-client-urls", "https://"+client, "--listen-metrics-urls", "http://"+metricsAddr,
		"--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA, "--client-cert-auth",
		"--log-level", "warn", "--shutdown-timeout", "5s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for exec.Command(bin, "healthcheck", "--url", "http://"+metricsAddr+"/health", "--timeout", "1s").Run() != nil {
		if time.Now().After(deadline) {
			t.Fatal("healthcheck never passed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	as := func(cn string) []string {
		p := tlstest.Write(t, t.TempDir(), ca.Client(t, cn), ca)
		return []string{"--endpoint", "https://" + client, "--cert", p.Cert, "--key", p.Key, "--cacert", p.CA}
	}
	ops := as("ops")
	for _, n := range []string{"x", "y"} {
		if out, err := tenantCmd(t, append([]string{"create", n, "--quota-keys", "1"}, ops...)...); err != nil {
			t.Fatalf("create %s through the endpoint: %v\n%s", n, err, out)
		}
	}
	if out, err := tenantCmd(t, append([]string{"list"}, ops...)...); err != nil || !strings.Contains(out, "x  ") || !strings.Contains(out, "y  ") {
		t.Fatalf("list through the endpoint: %v\n%s", err, out)
	}
	if _, err := tenantCmd(t, append([]string{"list"}, as("x")...)...); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("list with a tenant's certificate: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func(cn string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + client}, DialTimeout: 5 * time.Second,
			TLS:    &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, cn).TLS(t)}},
			Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	x, y := dial("x"), dial("y")
	for _, cli := range []*clientv3.Client{x, y} {
		if _, err := cli.Put(ctx, "a", "1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := x.Put(ctx, "b", "1"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("x's second key under a quota of 1: %v", err)
	}
	if out, err := tenantCmd(t, append([]string{"set-quota", "x", "--quota-keys", "2"}, ops...)...); err != nil {
		t.Fatalf("set-quota through the endpoint: %v\n%s", err, out)
	}
	if _, err := x.Get(ctx, "a"); err != nil { // reads the new quota
		t.Fatal(err)
	}
	if _, err := x.Put(ctx, "b", "1"); err != nil {
		t.Fatalf("x's second key after set-quota on the running server: %v", err)
	}
	metrics := scrape(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`fdb_etcd_tenant_requests_total{grpc_code="OK",grpc_method="Put",tenant="x"} 2`,
		`fdb_etcd_tenant_requests_total{grpc_code="OK",grpc_method="Put",tenant="_other"} 1`,
		`fdb_etcd_tenant_quota_refusals_total{quota="keys",tenant="x"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, `tenant="y"`) {
		t.Error("/metrics has series of y, past --tenant-metrics-limit 1")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
