package etcdcompat

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// envTenant "1" runs fdb-etcd with --tenancy=client-cert-cn: the tests'
// connections carry the client certificate of tenant compatTenant, and a
// second tenant (neighbourTenant) writes, watches, leases and compacts in
// the same server while each test runs. Every answer compared with etcd is
// then a tenant's, and a revision, key, lease or event of the neighbour
// reaching the tenant under test shows as a mismatch; the neighbour checks
// the converse on its own side (neighbour_test.go).
const envTenant = "ETCDCOMPAT_TENANT"

// The Common Names of the two tenants' client certificates.
const (
	compatTenant    = "compat"
	neighbourTenant = "neighbour"
)

// tenantPKI is set by TestMain in tenant mode, nil otherwise.
var tenantPKI *pki

// pki holds the files of a throwaway CA, a server certificate for
// 127.0.0.1 and one client certificate per tenant.
type pki struct {
	caFile, certFile, keyFile string
	roots                     *x509.CertPool
	clients                   map[string]tls.Certificate // by Common Name
}

// newPKI writes the CA, the server's certificate and a client certificate
// for each of cns into dir.
func newPKI(dir string, cns ...string) (*pki, error) {
	caKey, caCert, caDER, err := newCA()
	if err != nil {
		return nil, err
	}
	p := &pki{caFile: filepath.Join(dir, "ca.crt"), certFile: filepath.Join(dir, "server.crt"),
		keyFile: filepath.Join(dir, "server.key"), roots: x509.NewCertPool(), clients: map[string]tls.Certificate{}}
	p.roots.AddCert(caCert)
	if err := writePEMFile(p.caFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	srv := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "fdb-etcd"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	}
	certDER, keyDER, err := issue(srv, caCert, caKey)
	if err != nil {
		return nil, err
	}
	if err := writePEMFile(p.certFile, "CERTIFICATE", certDER); err != nil {
		return nil, err
	}
	if err := writePEMFile(p.keyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	for _, cn := range cns {
		cl := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		certDER, keyDER, err := issue(cl, caCert, caKey)
		if err != nil {
			return nil, err
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		p.clients[cn] = c
	}
	return p, nil
}

func newCA() (*ecdsa.PrivateKey, *x509.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdcompat-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, der, err
}

// issue signs tmpl (subject and usages set) with the CA and returns the
// certificate and its new key, both DER.
func issue(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certDER, keyDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(7*24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey); err != nil {
		return nil, nil, err
	}
	keyDER, err = x509.MarshalECPrivateKey(key)
	return certDER, keyDER, err
}

func writePEMFile(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// serverArgs are fdb-etcd's flags serving tenants by client certificate.
func (p *pki) serverArgs() []string {
	return []string{"--tenancy=client-cert-cn", "--tenant-auto-create", "--client-cert-auth",
		"--trusted-ca-file", p.caFile, "--cert-file", p.certFile, "--key-file", p.keyFile}
}

// clientTLS is the TLS configuration of tenant cn's connections.
func (p *pki) clientTLS(cn string) *tls.Config {
	c, ok := p.clients[cn]
	if !ok {
		panic(fmt.Sprintf("no client certificate for %q", cn))
	}
	return &tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}
}

// skipInTenantMode skips a test that does not serve through startPair:
// its fdb-etcd runs with command lines, imports or mirrors of its own,
// which tenant mode does not change; the default mode runs it.
func skipInTenantMode(t *testing.T) {
	t.Helper()
	if tenantPKI != nil {
		t.Skipf("%s=1: this test starts fdb-etcd with its own command line; it runs without %s", envTenant, envTenant)
	}
}
