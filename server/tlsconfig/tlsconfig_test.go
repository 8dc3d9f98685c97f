package tlsconfig_test

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  tlsconfig.Config
		ok   bool
	}{
		{"empty", tlsconfig.Config{}, true},
		{"pair", tlsconfig.Config{CertFile: "c", KeyFile: "k"}, true},
		{"cert without key", tlsconfig.Config{CertFile: "c"}, false},
		{"client auth without CA", tlsconfig.Config{CertFile: "c", KeyFile: "k", ClientCertAuth: true}, false},
		{"CA without cert", tlsconfig.Config{TrustedCAFile: "ca"}, false},
		{"tls13", tlsconfig.Config{CertFile: "c", KeyFile: "k", MinVersion: "TLS1.3"}, true},
		{"tls11", tlsconfig.Config{CertFile: "c", KeyFile: "k", MinVersion: "TLS1.1"}, false},
		{"cipher", tlsconfig.Config{CertFile: "c", KeyFile: "k", CipherSuites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}}, true},
		{"insecure cipher", tlsconfig.Config{CertFile: "c", KeyFile: "k", CipherSuites: []string{"TLS_RSA_WITH_RC4_128_SHA"}}, false},
		{"unknown cipher", tlsconfig.Config{CertFile: "c", KeyFile: "k", CipherSuites: []string{"NOPE"}}, false},
	}
	for _, c := range cases {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

// serve accepts TLS connections, completes the handshake and echoes nothing;
// each connection is held open until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	// TLS 1.3 reports a refused client certificate only on the first read.
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("x")); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func TestReloadOnChange(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	first := ca.Server(t, "first")
	f := tlstest.Write(t, dir, first, ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}

	old, err := dial(addr, client)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if got := old.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "first" {
		t.Fatalf("served %q, want first", got)
	}

	// A half-written rotation (new key, old certificate) keeps the old pair.
	second := ca.Server(t, "second")
	if err := os.WriteFile(f.Key, second.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := dial(addr, client)
	if err != nil {
		t.Fatalf("handshake during a half-written rotation: %v", err)
	}
	if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "first" {
		t.Fatalf("served %q during a half-written rotation, want first", got)
	}
	c.Close()

	tlstest.Write(t, dir, second, ca)
	c, err = dial(addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "second" {
		t.Fatalf("served %q after rotation, want second", got)
	}
	c.Close()
	if r.Reloads() != 1 {
		t.Fatalf("Reloads() = %d, want 1", r.Reloads())
	}

	// The connection made before the rotation still works.
	_ = old.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(old, make([]byte, 1)); err != nil {
		t.Fatalf("pre-rotation connection dropped: %v", err)
	}
}

func TestReloadIsThrottled(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	f := tlstest.Write(t, dir, ca.Server(t, "first"), ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, ReloadInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tlstest.Write(t, dir, ca.Server(t, "second"), ca)
	if got := r.Current().Certificates[0].Leaf.Subject.CommonName; got != "first" {
		t.Fatalf("reloaded within the interval: %q", got)
	}
}

func TestClientCertAuth(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	other := tlstest.NewCA(t, "other")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "server"), ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ClientCertAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	base := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}

	good := base.Clone()
	good.Certificates = []tls.Certificate{ca.Client(t, "kube-apiserver").TLS(t)}
	c, err := dial(addr, good)
	if err != nil {
		t.Fatalf("client with a trusted certificate refused: %v", err)
	}
	c.Close()

	if c, err := dial(addr, base); err == nil {
		c.Close()
		t.Fatal("client without a certificate accepted")
	}
	bad := base.Clone()
	bad.Certificates = []tls.Certificate{other.Client(t, "intruder").TLS(t)}
	if c, err := dial(addr, bad); err == nil {
		c.Close()
		t.Fatal("client with a certificate from another CA accepted")
	}
}

func TestALPN(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "server"), ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, MinVersion: "TLS1.3"})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	for _, c := range []struct {
		offer []string
		want  string
	}{
		{[]string{"h2"}, "h2"},                             // gRPC
		{[]string{"h2", "http/1.1"}, "http/1.1"},           // curl, Go's http.Client
		{[]string{"http/1.1"}, "http/1.1"},                 // HTTP/1.1-only clients
		{nil, ""},                                          // no ALPN at all
		{[]string{"grpc-exp", "h2"}, "h2"},                 // gRPC C core
		{[]string{"h2", "http/1.1", "spdy/3"}, "http/1.1"}, // anything HTTP/1.1-capable
	} {
		conn, err := dial(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: c.offer})
		if err != nil {
			t.Fatalf("offer %v: %v", c.offer, err)
		}
		if got := conn.ConnectionState().NegotiatedProtocol; got != c.want {
			t.Errorf("offer %v: negotiated %q, want %q", c.offer, got, c.want)
		}
		if v := conn.ConnectionState().Version; v != tls.VersionTLS13 {
			t.Errorf("version %x, want TLS 1.3", v)
		}
		conn.Close()
	}
	if _, err := dial(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MaxVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("TLS 1.2 client accepted with --tls-min-version=TLS1.3")
	}
}
