package main

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/autocompact"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
)

// etcd's --auto-compaction-mode values.
const (
	compactModePeriodic = "periodic"
	compactModeRevision = "revision"
)

// dataDir is --data-dir, or etcd's default ${name}.etcd.
func (c *etcdConfig) dataDir() string {
	if c.Dir == "" {
		return c.Name + ".etcd"
	}
	return c.Dir
}

// serverConfig turns the etcd configuration into the server's. It returns
// etcd's warnings about TLS settings that a plain URL ignores.
func (c *etcdConfig) serverConfig() (server.Config, []notice, error) {
	s := server.Config{
		Name: c.Name, ListenClientURLs: c.ListenClientURLs, AdvertiseClientURLs: c.AdvertiseClientURLs,
		ListenClientHTTPURLs: c.ListenClientHTTPURLs, ListenMetricsURLs: c.ListenMetricsURLs,
		MaxRequestBytes: int(c.MaxRequestBytes), MaxTxnOps: int(c.MaxTxnOps), MaxConcurrentStreams: c.MaxConcurrentStreams,
		GRPCKeepAliveMinTime: c.GRPCKeepAliveMinTime, GRPCKeepAliveInterval: c.GRPCKeepAliveInterval,
		GRPCKeepAliveTimeout: c.GRPCKeepAliveTimeout, SocketOpts: c.SocketOpts,
		ShutdownTimeout: c.ShutdownTimeout, EnablePprof: c.EnablePprof, DisableGRPCGateway: !c.EnableGRPCGateway,
		WarningApplyDuration: c.WarningApplyDuration, CORS: c.CORS, HostWhitelist: c.HostWhitelist,
	}
	if s.WarningApplyDuration == 0 {
		s.WarningApplyDuration = -1 // the server reads 0 as the default
	}
	s.Watch.ProgressNotifyInterval = c.WatchProgressNotifyInterval
	s.Quota.Bytes = c.QuotaBackendBytes
	if err := leaseTiming(&s, c.TickMs, c.ElectionMs); err != nil {
		return s, nil, err
	}
	var err error
	if s.AutoCompaction, err = c.autoCompaction(); err != nil {
		return s, nil, err
	}
	switch c.Backend {
	case "pebble":
		// The embedded store is locked to this process: physical
		// compaction need not wait out other writers' replays.
		s.MVCC.SoleWriter = true
	case "fdb":
		// Only a shared backend has other replicas to forward to.
		s.ForwardWrites = c.FDBForwardWrites
	default:
		return s, nil, fmt.Errorf("--backend: unknown backend %q (want pebble or fdb)", c.Backend)
	}
	notes, err := c.clientTLS(&s.TLS)
	return s, notes, err
}

// autoCompaction reads --auto-compaction-retention as etcd does: a whole
// number is hours (periodic) or revisions (revision); otherwise a duration.
func (c *etcdConfig) autoCompaction() (autocompact.Config, error) {
	ac := autocompact.Config{Mode: autocompact.Periodic}
	if c.AutoCompactionMode == compactModeRevision {
		ac.Mode = autocompact.Revision
	}
	if n, err := strconv.Atoi(c.AutoCompactionRetention); err == nil && n >= 0 {
		if ac.Mode == autocompact.Revision {
			ac.Revisions = int64(n)
		} else {
			ac.Period = time.Duration(n) * time.Hour
		}
		return ac, nil
	}
	d, err := time.ParseDuration(c.AutoCompactionRetention)
	if err != nil {
		return ac, fmt.Errorf("error parsing CompactionRetention: %w", err)
	}
	if ac.Mode == autocompact.Revision {
		// etcd reads a duration given in revision mode as that many
		// nanoseconds' worth of revisions.
		ac.Revisions = int64(d)
	} else {
		ac.Period = d
	}
	return ac, nil
}

// clientTLS fills the client TLS configuration. As in etcd, an https or
// unixs URL needs a certificate (or --auto-tls), and on http and unix URLs
// the certificate and --client-cert-auth are ignored with a warning.
func (c *etcdConfig) clientTLS(t *tlsconfig.Config) ([]notice, error) {
	ct := c.ClientTLS
	*t = tlsconfig.Config{
		CertFile: ct.CertFile, KeyFile: ct.KeyFile, TrustedCAFile: ct.TrustedCAFile, ClientCertAuth: ct.CertAuth,
		ClientCertFile: ct.ClientCertFile, ClientKeyFile: ct.ClientKeyFile, CRLFile: ct.CRLFile,
		AllowedHostnames: ct.AllowedHostnames, CipherSuites: c.CipherSuites,
		MinVersion: c.TLSMinVersion, MaxVersion: c.TLSMaxVersion,
	}
	var notes []notice
	secure := false
	for _, u := range append(append([]url.URL{}, c.ListenClientURLs...), c.ListenClientHTTPURLs...) {
		if u.Scheme == "http" || u.Scheme == "unix" {
			if !ct.empty() {
				notes = append(notes, notice{zapcore.WarnLevel, "scheme is http or unix while key and cert files are present; ignoring key and cert files", []zap.Field{zap.String("client-url", u.String())}})
			}
			if ct.CertAuth {
				notes = append(notes, notice{zapcore.WarnLevel, "scheme is http or unix while --client-cert-auth is enabled; ignoring client cert auth for this URL", []zap.Field{zap.String("client-url", u.String())}})
			}
			continue
		}
		secure = true
		if ct.empty() && !ct.AutoTLS {
			return notes, fmt.Errorf("TLS key/cert (--cert-file, --key-file) must be provided for client url %s with HTTPS scheme", u.String())
		}
	}
	if !secure && ct.empty() {
		// Nothing serves TLS: the settings that only make sense with a
		// certificate are ignored, as they are in etcd.
		t.ClientCertAuth, t.TrustedCAFile = false, ""
	}
	for _, u := range c.ListenMetricsURLs {
		if (u.Scheme == "https" || u.Scheme == "unixs") && ct.empty() && !ct.AutoTLS {
			return notes, fmt.Errorf("TLS key/cert (--cert-file, --key-file) must be provided for metrics url %s with HTTPS scheme", u.String())
		}
	}
	if ct.AutoTLS && ct.empty() {
		return notes, nil // the certificate is made at start (autoTLS)
	}
	return notes, t.Validate()
}

// leaseTiming derives the lessor's minimum TTL and promotion extension from
// etcd's raft timing flags, with etcd's formulas (etcd's validation ran
// before): the minimum TTL is 1.5 election timeouts in whole heartbeats,
// rounded up to seconds.
func leaseTiming(c *server.Config, heartbeatMs, electionMs uint) error {
	if heartbeatMs == 0 || electionMs == 0 || 5*heartbeatMs > electionMs {
		return fmt.Errorf("--election-timeout[%vms] should be at least as 5 times as --heartbeat-interval[%vms]", electionMs, heartbeatMs)
	}
	ticks := electionMs / heartbeatMs
	minTTL := time.Duration((3*ticks)/2*heartbeatMs) * time.Millisecond
	c.Lease.MinTTL = int64((minTTL + time.Second - 1) / time.Second)
	c.Lease.Extend = time.Duration(electionMs) * time.Millisecond
	return nil
}
