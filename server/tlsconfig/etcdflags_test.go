package tlsconfig_test

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
)

// TestClientCRL: --client-crl-file refuses a revoked client certificate at
// the handshake and accepts the others; the list is read on every
// handshake, as etcd reads it.
func TestClientCRL(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	f := tlstest.Write(t, dir, ca.Server(t, "server"), ca)
	revoked, kept := ca.Client(t, "revoked"), ca.Client(t, "kept")
	crlPath := filepath.Join(dir, "crl.pem")
	writeCRL(t, crlPath, ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA,
		ClientCertAuth: true, CRLFile: crlPath, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	client := func(p tlstest.Pair) *tls.Config {
		return &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{p.TLS(t)}}
	}
	if c, err := dial(addr, client(revoked)); err != nil {
		t.Fatalf("before the revocation: %v", err)
	} else {
		c.Close()
	}
	writeCRL(t, crlPath, ca, revoked.Cert.SerialNumber)
	if c, err := dial(addr, client(revoked)); err == nil {
		c.Close()
		t.Fatal("revoked certificate accepted")
	}
	if c, err := dial(addr, client(kept)); err != nil {
		t.Fatalf("certificate not on the list refused: %v", err)
	} else {
		c.Close()
	}
}

func writeCRL(t *testing.T, path string, ca *tlstest.CA, serials ...*big.Int) {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(time.Now().UnixNano()), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour)}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAllowedHostnames: with --client-cert-allowed-hostname a client
// certificate must be valid for one of the names.
func TestAllowedHostnames(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	f := tlstest.Write(t, t.TempDir(), ca.Server(t, "server"), ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA,
		ClientCertAuth: true, AllowedHostnames: []string{"nowhere.example", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	base := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	named := base.Clone()
	named.Certificates = []tls.Certificate{ca.Server(t, "named-client").TLS(t)} // SANs localhost, 127.0.0.1
	if c, err := dial(addr, named); err != nil {
		t.Fatalf("certificate for localhost refused: %v", err)
	} else {
		c.Close()
	}
	anonymous := base.Clone()
	anonymous.Certificates = []tls.Certificate{ca.Client(t, "no-names").TLS(t)}
	if c, err := dial(addr, anonymous); err == nil {
		c.Close()
		t.Fatal("certificate valid for none of the allowed hostnames accepted")
	}
}

// TestMaxVersionAndClientCert: --tls-max-version caps the handshake, and
// ClientConfig presents --client-cert-file's certificate when given.
func TestMaxVersionAndClientCert(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	f := tlstest.Write(t, dir, ca.Server(t, "server"), ca)
	cl := tlstest.Write(t, t.TempDir(), ca.Client(t, "forwarder"), ca)
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: f.Cert, KeyFile: f.Key, TrustedCAFile: f.CA, ClientCertAuth: true,
		MaxVersion: "TLS1.2", ClientCertFile: cl.Cert, ClientKeyFile: cl.Key})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	cc := r.ClientConfig()
	cc.ServerName = "localhost"
	c, err := dial(addr, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := c.ConnectionState()
	if st.Version != tls.VersionTLS12 {
		t.Errorf("negotiated %x, want TLS 1.2", st.Version)
	}
	got, err := cc.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(got.Certificate[0])
	if err != nil || leaf.Subject.CommonName != "forwarder" {
		t.Fatalf("client certificate %v %v", leaf.Subject, err)
	}
	for _, bad := range []tlsconfig.Config{
		{CertFile: "c", KeyFile: "k", MinVersion: "TLS1.3", MaxVersion: "TLS1.2"},
		{CertFile: "c", KeyFile: "k", MaxVersion: "TLS1.1"},
		{CertFile: "c", KeyFile: "k", ClientCertFile: "cc"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
