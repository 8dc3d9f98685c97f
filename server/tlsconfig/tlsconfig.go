// Package tlsconfig builds the server-side TLS configuration from etcd's
// flags (--cert-file, --key-file, --trusted-ca-file, --client-cert-auth,
// --client-crl-file, --client-cert-allowed-hostname, --client-cert-file,
// --client-key-file, --cipher-suites, --tls-min-version, --tls-max-version)
// and reloads the certificate, key and CA
// bundle when their files change, so that a certificate rotated by
// cert-manager is served on the next handshake without a restart and without
// touching established connections.
//
// Reloading is lazy: every handshake asks for the current configuration
// (tls.Config.GetConfigForClient), which stats the three files at most once
// per ReloadInterval and re-reads them only when a file's size, modification
// time or identity (inode, as after Kubernetes' atomic symlink swap of a
// Secret volume) changed. A change that does not parse — a key written before
// its certificate, say — keeps the previous configuration and is retried on
// the next check.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultReloadInterval bounds how often handshakes stat the files.
const DefaultReloadInterval = time.Second

// Config is the TLS part of the server configuration.
type Config struct {
	CertFile      string
	KeyFile       string
	TrustedCAFile string
	// ClientCertAuth refuses, at the handshake, every client that does not
	// present a certificate signed by TrustedCAFile.
	ClientCertAuth bool
	// CipherSuites are Go/IANA names (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, ...)
	// for TLS 1.2; TLS 1.3 suites are not configurable. Empty means Go's
	// defaults.
	CipherSuites []string
	// MinVersion is "TLS1.2" (the default) or "TLS1.3".
	MinVersion string
	// MaxVersion is "TLS1.2", "TLS1.3" or empty (Go's highest).
	MaxVersion string
	// ClientCertFile and ClientKeyFile are the certificate this server
	// presents when it dials another replica (to forward writes); empty
	// means CertFile and KeyFile, as in etcd.
	ClientCertFile string
	ClientKeyFile  string
	// CRLFile is a certificate revocation list (PEM or DER): a client
	// certificate it names is refused at the handshake. It is read on
	// every handshake that presents a certificate, as etcd reads it.
	CRLFile string
	// AllowedHostnames: when set, a client certificate must be valid for
	// one of these hostnames or IP addresses (etcd's
	// --client-cert-allowed-hostname).
	AllowedHostnames []string
	// ReloadInterval: see DefaultReloadInterval; negative checks on every
	// handshake (tests).
	ReloadInterval time.Duration
	Logger         *zap.Logger
}

// Enabled reports whether any server TLS is configured.
func (c *Config) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

// Validate checks the flag combination without reading the files.
func (c *Config) Validate() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("--cert-file and --key-file must be given together")
	}
	if c.ClientCertAuth && c.TrustedCAFile == "" {
		return errors.New("--client-cert-auth needs --trusted-ca-file")
	}
	if !c.Enabled() && (c.ClientCertAuth || c.TrustedCAFile != "") {
		return errors.New("--client-cert-auth and --trusted-ca-file need --cert-file and --key-file")
	}
	if _, err := ParseCipherSuites(c.CipherSuites); err != nil {
		return err
	}
	minV, err := ParseVersion(c.MinVersion)
	if err != nil {
		return err
	}
	maxV, err := parseMaxVersion(c.MaxVersion)
	if err != nil {
		return err
	}
	if maxV != 0 && minV > maxV {
		return fmt.Errorf("min version (%s) is greater than max version (%s)", c.MinVersion, c.MaxVersion)
	}
	if (c.ClientCertFile == "") != (c.ClientKeyFile == "") {
		return errors.New("--client-cert-file and --client-key-file must be given together")
	}
	return nil
}

// parseMaxVersion maps --tls-max-version: empty is 0, Go's highest.
func parseMaxVersion(s string) (uint16, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	v, err := ParseVersion(s)
	if err != nil {
		return 0, fmt.Errorf("--tls-max-version: unsupported version %q (want TLS1.2 or TLS1.3)", s)
	}
	return v, nil
}

// ParseVersion maps etcd's --tls-min-version values to Go's constants; the
// empty string is TLS 1.2.
func ParseVersion(s string) (uint16, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "", "TLS1.2":
		return tls.VersionTLS12, nil
	case "TLS1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("--tls-min-version: unsupported version %q (want TLS1.2 or TLS1.3)", s)
}

// ParseCipherSuites maps cipher suite names to ids. Go's insecure suites
// (RC4, 3DES, CBC-SHA256) are refused, as etcd refuses them.
func ParseCipherSuites(names []string) ([]uint16, error) {
	if len(names) == 0 {
		return nil, nil
	}
	known := map[string]uint16{}
	for _, cs := range tls.CipherSuites() {
		known[cs.Name] = cs.ID
	}
	var ids []uint16
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		id, ok := known[n]
		if !ok {
			return nil, fmt.Errorf("--cipher-suites: unknown or insecure cipher suite %q", n)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Reloader serves the current TLS configuration and reloads it from files.
type Reloader struct {
	cfg      Config
	lg       *zap.Logger
	interval time.Duration
	ciphers  []uint16
	minVer   uint16
	maxVer   uint16
	now      func() time.Time

	mu        sync.Mutex
	cur       *tls.Config
	client    *tls.Certificate // what ClientConfig presents: ClientCertFile's, else cur's
	stamps    [5]os.FileInfo   // cert, key, CA, client cert and key as last loaded
	lastCheck time.Time
	lastErr   string
	reloads   int
}

// New loads the files once, failing if they do not make a valid
// configuration.
func New(cfg Config) (*Reloader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, errors.New("tlsconfig: no certificate configured")
	}
	r := &Reloader{cfg: cfg, lg: cfg.Logger, interval: cfg.ReloadInterval, now: time.Now}
	if r.lg == nil {
		r.lg = zap.NewNop()
	}
	if r.interval == 0 {
		r.interval = DefaultReloadInterval
	}
	r.ciphers, _ = ParseCipherSuites(cfg.CipherSuites)
	r.minVer, _ = ParseVersion(cfg.MinVersion)
	r.maxVer, _ = parseMaxVersion(cfg.MaxVersion)
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	cur, client, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur, r.client, r.stamps, r.lastCheck = cur, client, stamps, r.now()
	return r, nil
}

// ServerConfig returns the configuration to hand to tls.NewListener: every
// handshake gets the current certificate through GetConfigForClient.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         r.minVer,
		MaxVersion:         r.maxVer,
		NextProtos:         []string{"h2", "http/1.1"},
		GetConfigForClient: r.configForClient,
	}
}

// Reloads reports how many times the files were reloaded after New.
func (r *Reloader) Reloads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloads
}

// configForClient picks the current configuration and the application
// protocol. gRPC clients offer only "h2"; HTTP clients (curl, Go's
// http.Client, Prometheus, kubelet) also offer "http/1.1" and are given it,
// so that on the shared client port HTTP/2 means gRPC and HTTP/1.1 means the
// health and metrics endpoints, exactly as on a plain-text port.
func (r *Reloader) configForClient(hello *tls.ClientHelloInfo) (*tls.Config, error) {
	cfg := r.Current()
	for _, p := range hello.SupportedProtos {
		if p == "http/1.1" {
			cfg = cfg.Clone()
			cfg.NextProtos = []string{"http/1.1"}
			break
		}
	}
	return cfg, nil
}

// Current returns the configuration for a new handshake, reloading the files
// first when they changed. It never fails: a broken update keeps serving the
// last good configuration.
func (r *Reloader) Current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	return r.cur
}

// refresh reloads the files when they changed; r.mu is held.
func (r *Reloader) refresh() {
	now := r.now()
	if r.interval > 0 && now.Sub(r.lastCheck) < r.interval {
		return
	}
	r.lastCheck = now
	stamps, err := r.stat()
	if err == nil && r.unchanged(stamps) {
		return
	}
	var cur *tls.Config
	var client *tls.Certificate
	if err == nil {
		cur, client, err = r.load()
	}
	if err != nil {
		if msg := err.Error(); msg != r.lastErr {
			r.lastErr = msg
			r.lg.Warn("TLS files changed but do not load; serving the previous certificate", zap.Error(err))
		}
		return
	}
	r.cur, r.client, r.stamps, r.lastErr = cur, client, stamps, ""
	r.reloads++
	if leaf := cur.Certificates[0].Leaf; leaf != nil {
		r.lg.Info("reloaded TLS certificate", zap.String("cert-file", r.cfg.CertFile),
			zap.String("subject", leaf.Subject.String()), zap.Time("not-after", leaf.NotAfter))
	}
}

// currentClient is the certificate ClientConfig presents, reloaded as
// Current reloads.
func (r *Reloader) currentClient() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refresh()
	return r.client
}

func (r *Reloader) files() [5]string {
	return [5]string{r.cfg.CertFile, r.cfg.KeyFile, r.cfg.TrustedCAFile, r.cfg.ClientCertFile, r.cfg.ClientKeyFile}
}

func (r *Reloader) stat() ([5]os.FileInfo, error) {
	var out [5]os.FileInfo
	for i, f := range r.files() {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return out, err
		}
		out[i] = fi
	}
	return out, nil
}

func (r *Reloader) unchanged(now [5]os.FileInfo) bool {
	for i, fi := range now {
		old := r.stamps[i]
		if (fi == nil) != (old == nil) {
			return false
		}
		if fi == nil {
			continue
		}
		if fi.Size() != old.Size() || !fi.ModTime().Equal(old.ModTime()) || !os.SameFile(fi, old) {
			return false
		}
	}
	return true
}

// load reads the files into a complete server configuration and the
// certificate to present as a client.
func (r *Reloader) load() (*tls.Config, *tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("load key pair %s, %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	client := &cert
	if r.cfg.ClientCertFile != "" {
		cc, err := tls.LoadX509KeyPair(r.cfg.ClientCertFile, r.cfg.ClientKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("load client key pair %s, %s: %w", r.cfg.ClientCertFile, r.cfg.ClientKeyFile, err)
		}
		client = &cc
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   r.minVer,
		MaxVersion:   r.maxVer,
		CipherSuites: r.ciphers,
		NextProtos:   []string{"h2", "http/1.1"},
		ClientAuth:   tls.NoClientCert,
	}
	r.verifyClients(cfg)
	if r.cfg.TrustedCAFile != "" {
		pem, err := os.ReadFile(r.cfg.TrustedCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("read trusted CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("trusted CA file %s holds no PEM certificate", r.cfg.TrustedCAFile)
		}
		cfg.ClientCAs = pool
		// Like etcd: with a CA but without --client-cert-auth, a client may
		// still present a certificate, and it is verified if it does.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if r.cfg.ClientCertAuth {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, client, nil
}

// ClientConfig is the configuration for dialing another replica (to forward
// writes): --client-cert-file's certificate, else this server's, as the
// client certificate and the trusted CA as the roots (the certificate
// follows reloads), as etcd members use their certificates towards each
// other.
func (r *Reloader) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   r.minVer,
		MaxVersion:   r.maxVer,
		CipherSuites: r.ciphers,
		RootCAs:      r.Current().ClientCAs,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.currentClient(), nil
		},
	}
}

// verifyClients adds etcd's checks of a client certificate beyond the CA:
// --client-cert-allowed-hostname (the certificate must be valid for one of
// the names) and --client-crl-file (its serial must not be revoked).
func (r *Reloader) verifyClients(cfg *tls.Config) {
	allowed, crl := r.cfg.AllowedHostnames, r.cfg.CRLFile
	if len(allowed) > 0 {
		cfg.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			for _, chain := range chains {
				if len(chain) == 0 {
					continue
				}
				for _, h := range allowed {
					if chain[0].VerifyHostname(h) == nil {
						return nil
					}
				}
			}
			return errors.New("client certificate authentication failed")
		}
	}
	if crl != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil
			}
			return checkCRL(crl, cs.PeerCertificates)
		}
	}
}

// checkCRL refuses certificates whose serial the revocation list names.
func checkCRL(path string, certs []*x509.Certificate) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	list, err := x509.ParseRevocationList(b)
	if err != nil {
		return err
	}
	for _, rc := range list.RevokedCertificateEntries {
		for _, c := range certs {
			if rc.SerialNumber.Cmp(c.SerialNumber) == 0 {
				return fmt.Errorf("certificate serial %x revoked", c.SerialNumber.Bytes())
			}
		}
	}
	return nil
}
