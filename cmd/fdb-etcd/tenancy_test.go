package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

func TestTenancyFlags(t *testing.T) {
	tlsArgs := []string{"--listen-client-urls", "https://127.0.0.1:2379", "--cert-file", "c", "--key-file", "k",
		"--trusted-ca-file", "ca"}
	for _, bad := range [][]string{
		{"--tenancy", "per-namespace"},
		{"--tenancy", "client-cert-cn"},
		append([]string{"--tenancy", "client-cert-cn"}, tlsArgs...),
		{"--tenant-auto-create"},
		append([]string{"--tenancy", "client-cert-cn", "--client-cert-auth", "--tenant-idle-timeout", "0s"}, tlsArgs...),
		append([]string{"--tenancy", "client-cert-cn", "--client-cert-auth", "--listen-client-http-urls", "https://127.0.0.1:2380"}, tlsArgs...),
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	c, err := parseFlags(append([]string{"--tenancy", "client-cert-cn", "--client-cert-auth", "--tenant-auto-create"}, tlsArgs...))
	if err != nil || c.etcd.Tenancy != tenancyClientCertCN || !c.etcd.TenantAutoCreate || c.etcd.TenantIdleTimeout != 5*time.Minute {
		t.Fatalf("parsed %+v: %v", c.etcd.fdbEtcdConfig, err)
	}
}

// tenantCmd runs `fdb-etcd tenant args...` in-process.
func tenantCmd(t *testing.T, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	if code := run(append([]string{"tenant"}, args...), nil, &out, &errOut); code != 0 {
		return out.String(), errors.New(errOut.String())
	}
	return out.String(), nil
}

// TestTenantBinary runs the binary with --tenancy=client-cert-cn against a
// store whose tenants `fdb-etcd tenant` administers.
func TestTenantBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	data := filepath.Join(t.TempDir(), "data")
	if _, err := tenantCmd(t, "create", "team-a", "--data-dir", data); err != nil {
		t.Fatal(err)
	}
	if _, err := tenantCmd(t, "create", "team-b", "--data-dir", data, "--quota-backend-bytes", "1048576"); err != nil {
		t.Fatal(err)
	}
	if _, err := tenantCmd(t, "create", "team-a", "--data-dir", data); err == nil {
		t.Fatal("second create of team-a succeeded")
	}
	if out, err := tenantCmd(t, "list", "--data-dir", data); err != nil || !strings.Contains(out, "team-a") || !strings.Contains(out, "team-b  2   1048576") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, err := tenantCmd(t, "set-quota", "team-a", "--quota-backend-bytes", "-1", "--data-dir", data); err != nil || !strings.Contains(out, "team-a  1   -1") {
		t.Fatalf("set-quota: %v\n%s", err, out)
	}

	bin := buildBinary(t)
	ca := tlstest.NewCA(t, "tenants-ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "fdb-etcd-0"), ca)
	client, metricsAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--data-dir", data, "--tenancy", "client-cert-cn",
		"--listen-client-urls", "https://"+client, "--listen-metrics-urls", "http://"+metricsAddr,
		"--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA, "--client-cert-auth",
		"--log-level", "warn", "--shutdown-timeout", "5s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	deadline := time.Now().Add(15 * time.Second)
	for exec.Command(bin, "healthcheck", "--url", "http://"+metricsAddr+"/health", "--timeout", "1s").Run() != nil {
		if time.Now().After(deadline) {
			t.Fatal("healthcheck never passed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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
	for _, cn := range []string{"team-a", "team-b"} {
		r, err := dial(cn).Put(ctx, "/registry/x", cn)
		if err != nil || r.Header.Revision != 2 {
			t.Fatalf("%s's first put: %v %v", cn, r, err)
		}
	}
	if st, err := dial("team-b").Status(ctx, "https://"+client); err != nil || st.DbSizeQuota != 1048576 {
		t.Fatalf("team-b's status: %v %v, want its own quota", st, err)
	}
	if _, err := dial("nobody").Get(ctx, "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("unknown tenant: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit within 20 s of SIGTERM")
	}
	if out, err := tenantCmd(t, "delete", "team-a", "--data-dir", data); err != nil {
		t.Fatalf("delete: %v %s", err, out)
	}
	if _, err := tenantCmd(t, "describe", "team-a", "--data-dir", data); err == nil {
		t.Fatal("describe of a deleted tenant succeeded")
	}
}
