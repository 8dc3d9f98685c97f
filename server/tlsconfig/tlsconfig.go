// Package tlsconfig builds the server-side TLS configuration from etcd's
// flags (--cert-file, --key-file, --trusted-ca-file, --client-cert-auth,
// --cipher-suites, --tls-min-version) and reloads the certificate, key and CA
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
	if _, err := ParseVersion(c.MinVersion); err != nil {
		return err
	}
	return nil
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
	now      func() time.Time

	mu        sync.Mutex
	cur       *tls.Config
	stamps    [3]os.FileInfo // cert, key, CA as last loaded
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
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	cur, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur, r.stamps, r.lastCheck = cur, stamps, r.now()
	return r, nil
}

// ServerConfig returns the configuration to hand to tls.NewListener: every
// handshake gets the current certificate through GetConfigForClient.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         r.minVer,
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
	now := r.now()
	if r.interval > 0 && now.Sub(r.lastCheck) < r.interval {
		return r.cur
	}
	r.lastCheck = now
	stamps, err := r.stat()
	if err == nil && r.unchanged(stamps) {
		return r.cur
	}
	var cur *tls.Config
	if err == nil {
		cur, err = r.load()
	}
	if err != nil {
		if msg := err.Error(); msg != r.lastErr {
			r.lastErr = msg
			r.lg.Warn("TLS files changed but do not load; serving the previous certificate", zap.Error(err))
		}
		return r.cur
	}
	r.cur, r.stamps, r.lastErr = cur, stamps, ""
	r.reloads++
	if leaf := cur.Certificates[0].Leaf; leaf != nil {
		r.lg.Info("reloaded TLS certificate", zap.String("cert-file", r.cfg.CertFile),
			zap.String("subject", leaf.Subject.String()), zap.Time("not-after", leaf.NotAfter))
	}
	return r.cur
}

func (r *Reloader) files() [3]string {
	return [3]string{r.cfg.CertFile, r.cfg.KeyFile, r.cfg.TrustedCAFile}
}

func (r *Reloader) stat() ([3]os.FileInfo, error) {
	var out [3]os.FileInfo
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

func (r *Reloader) unchanged(now [3]os.FileInfo) bool {
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

// load reads the files into a complete server configuration.
func (r *Reloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load key pair %s, %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   r.minVer,
		CipherSuites: r.ciphers,
		NextProtos:   []string{"h2", "http/1.1"},
		ClientAuth:   tls.NoClientCert,
	}
	if r.cfg.TrustedCAFile != "" {
		pem, err := os.ReadFile(r.cfg.TrustedCAFile)
		if err != nil {
			return nil, fmt.Errorf("read trusted CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("trusted CA file %s holds no PEM certificate", r.cfg.TrustedCAFile)
		}
		cfg.ClientCAs = pool
		// Like etcd: with a CA but without --client-cert-auth, a client may
		// still present a certificate, and it is verified if it does.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if r.cfg.ClientCertAuth {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, nil
}

// ClientConfig is the configuration for dialing another replica (to forward
// writes): this server's certificate as the client certificate and the
// trusted CA as the roots (the certificate follows reloads), as etcd members
// use their certificates towards each other.
func (r *Reloader) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   r.minVer,
		CipherSuites: r.ciphers,
		RootCAs:      r.Current().ClientCAs,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &r.Current().Certificates[0], nil
		},
	}
}
