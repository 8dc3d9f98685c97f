package main

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

func TestOpsFlags(t *testing.T) {
	c, err := parseFlags([]string{
		"--listen-client-urls", "https://127.0.0.1:2379", "--listen-metrics-urls", "http://0.0.0.0:2381",
		"--cert-file", "c", "--key-file", "k", "--trusted-ca-file", "ca", "--client-cert-auth",
		"--cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
		"--tls-min-version", "TLS1.3", "--warning-apply-duration", "250ms",
	})
	if err != nil {
		t.Fatal(err)
	}
	s := c.server
	if s.TLS.CertFile != "c" || s.TLS.KeyFile != "k" || s.TLS.TrustedCAFile != "ca" || !s.TLS.ClientCertAuth ||
		len(s.TLS.CipherSuites) != 2 || s.TLS.MinVersion != "TLS1.3" || s.WarningApplyDuration != 250*time.Millisecond ||
		len(s.ListenMetricsURLs) != 1 || s.ListenMetricsURLs[0].Host != "0.0.0.0:2381" {
		t.Fatalf("parsed %+v", s)
	}
	if c, err := parseFlags(nil); err != nil || c.server.WarningApplyDuration != 100*time.Millisecond {
		t.Fatalf("default --warning-apply-duration: %v %v", c.server.WarningApplyDuration, err)
	}
	for _, bad := range [][]string{
		{"--listen-client-urls", "https://127.0.0.1:2379"},
		{"--listen-metrics-urls", "https://127.0.0.1:2381"},
		{"--cert-file", "c"},
		{"--cert-file", "c", "--key-file", "k", "--client-cert-auth"},
		{"--cert-file", "c", "--key-file", "k", "--tls-min-version", "TLS1.0"},
		{"--cert-file", "c", "--key-file", "k", "--cipher-suites", "TLS_RSA_WITH_RC4_128_SHA"},
		{"--listen-metrics-urls", "unix://x"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestBinaryProductionMode runs the real binary as a StatefulSet would:
// mutual TLS on the client port, plain-text metrics and health, then SIGTERM.
func TestBinaryProductionMode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "fdb-etcd Version:") || !strings.Contains(string(out), "etcd API Version: 3.6.16") {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}

	ca := tlstest.NewCA(t, "etcd-ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "fdb-etcd-0"), ca)
	client, metricsAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", "https://"+client, "--listen-metrics-urls", "http://"+metricsAddr,
		"--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA, "--client-cert-auth",
		"--log-level", "warn", "--shutdown-timeout", "5s")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
	}()

	health := func() error {
		return exec.Command(bin, "healthcheck", "--url", "http://"+metricsAddr+"/health", "--timeout", "1s").Run()
	}
	deadline := time.Now().Add(15 * time.Second)
	for health() != nil {
		if time.Now().After(deadline) {
			t.Fatal("healthcheck never passed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := exec.Command(bin, "healthcheck", "--url", "https://"+client+"/health",
		"--cacert", f.CA, "--cert", f.Cert, "--key", f.Key).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != `{"health":"true","reason":""}` {
		t.Fatalf("healthcheck over mutual TLS: %v %s", err, out)
	}
	if err := exec.Command(bin, "healthcheck", "--url", "https://"+client+"/health", "--cacert", f.CA).Run(); err == nil {
		t.Fatal("healthcheck without a client certificate passed against --client-cert-auth")
	}

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"https://" + client},
		DialTimeout: 5 * time.Second,
		TLS:         &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "kube-apiserver").TLS(t)}},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/registry/x", "y"); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit within 15 s of SIGTERM")
	}
	if health() == nil {
		t.Fatal("healthy after exit")
	}
}

// TestAPIFlags: etcd's --quota-backend-bytes (0, etcd's default, means
// 2 GiB) and --enable-grpc-gateway (on by default).
func TestAPIFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil || c.server.Quota.Bytes != 0 || c.server.DisableGRPCGateway {
		t.Fatalf("defaults: quota %d, gateway disabled %t, %v", c.server.Quota.Bytes, c.server.DisableGRPCGateway, err)
	}
	c, err = parseFlags([]string{"--quota-backend-bytes", "8589934592", "--enable-grpc-gateway=false"})
	if err != nil || c.server.Quota.Bytes != 8<<30 || !c.server.DisableGRPCGateway {
		t.Fatalf("parsed: quota %d, gateway disabled %t, %v", c.server.Quota.Bytes, c.server.DisableGRPCGateway, err)
	}
	if _, err := parseFlags([]string{"--quota-backend-bytes", "2GiB"}); err == nil {
		t.Fatal("--quota-backend-bytes=2GiB accepted; etcd takes a byte count")
	}
}
