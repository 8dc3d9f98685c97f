package servers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// SupportsTenancy reports whether server name can serve a keyspace per
// client certificate (--tenancy=client-cert-cn): fdb-etcd with one
// replica, on either store. etcd and kine have no tenancy; three replicas
// would need peer certificates the harness does not issue.
func SupportsTenancy(name string) bool { return name == FDBEtcd || name == FDBEtcdFDB }

// certAuthority issues the certificates of a tenanted server and of its
// clients, one per tenant (the Common Name names the tenant).
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCertAuthority() (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fdb-etcd-bench-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &certAuthority{cert: cert, key: key, pool: pool}, nil
}

// issue returns a certificate for cn, valid for loopback when server.
func (ca *certAuthority) issue(cn string, server bool) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// serverFiles writes the server's certificate, key and the CA into dir and
// returns the flags that serve tenants with them.
func (ca *certAuthority) serverFiles(dir string) ([]string, error) {
	c, err := ca.issue("fdb-etcd-bench-server", true)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return nil, err
	}
	files := map[string]*pem.Block{
		"server.crt": {Type: "CERTIFICATE", Bytes: c.Certificate[0]},
		"server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
		"ca.crt":     {Type: "CERTIFICATE", Bytes: ca.cert.Raw},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			return nil, err
		}
	}
	return []string{
		"--cert-file", filepath.Join(dir, "server.crt"), "--key-file", filepath.Join(dir, "server.key"),
		"--trusted-ca-file", filepath.Join(dir, "ca.crt"), "--client-cert-auth",
		"--tenancy", "client-cert-cn", "--tenant-auto-create",
	}, nil
}

// ClientTLS is the TLS configuration of a client of tenant cn; it fails
// on a server started without StartOptions.Tenancy.
func (i *Instance) ClientTLS(cn string) (*tls.Config, error) {
	if i.ca == nil {
		return nil, errors.New(i.Name + " serves no tenants")
	}
	c, err := i.ca.issue(cn, false)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, RootCAs: i.ca.pool, MinVersion: tls.VersionTLS12}, nil
}
