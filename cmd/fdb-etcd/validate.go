package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/tlsutil"
)

// experimentalRenames are etcd 3.6's experimental flags and the flags that
// replace them: giving both is an error, giving the old one sets the new.
var experimentalRenames = [][2]string{
	{"experimental-compact-hash-check-time", "compact-hash-check-time"},
	{"experimental-corrupt-check-time", "corrupt-check-time"},
	{"experimental-compaction-batch-limit", "compaction-batch-limit"},
	{"experimental-watch-progress-notify-interval", "watch-progress-notify-interval"},
	{"experimental-warning-apply-duration", "warning-apply-duration"},
	{"experimental-bootstrap-defrag-threshold-megabytes", "bootstrap-defrag-threshold-megabytes"},
	{"experimental-memory-mlock", "memory-mlock"},
	{"experimental-snapshot-catchup-entries", "snapshot-catchup-entries"},
	{"experimental-compaction-sleep-interval", "compaction-sleep-interval"},
	{"experimental-downgrade-check-time", "downgrade-check-time"},
	{"experimental-peer-skip-client-san-verification", "peer-skip-client-san-verification"},
	{"experimental-enable-distributed-tracing", "enable-distributed-tracing"},
	{"experimental-distributed-tracing-address", "distributed-tracing-address"},
	{"experimental-distributed-tracing-service-name", "distributed-tracing-service-name"},
	{"experimental-distributed-tracing-instance-id", "distributed-tracing-instance-id"},
	{"experimental-distributed-tracing-sampling-rate", "distributed-tracing-sampling-rate"},
}

// maxElectionMs is etcd's upper bound for --election-timeout.
const maxElectionMs = 50000

// validate refuses what etcd 3.6's embed.Config.Validate refuses, with
// etcd's words, for the settings fdb-etcd accepts but does not use as well:
// a command line that etcd refuses should not start fdb-etcd either. The
// logging settings are checked when the logger is built.
func (c *etcdConfig) validate() error {
	for _, r := range experimentalRenames {
		if c.explicit[r[0]] && c.explicit[r[1]] {
			return fmt.Errorf("cannot set --%s and --%s at the same time, please use --%s only", r[0], r[1], r[1])
		}
	}
	if err := c.validateURLs(); err != nil {
		return err
	}
	if err := c.validateBootstrap(); err != nil {
		return err
	}
	if c.TickMs == 0 {
		return fmt.Errorf("--heartbeat-interval must be >0 (set to %dms)", c.TickMs)
	}
	if c.ElectionMs == 0 {
		return fmt.Errorf("--election-timeout must be >0 (set to %dms)", c.ElectionMs)
	}
	if 5*c.TickMs > c.ElectionMs {
		return fmt.Errorf("--election-timeout[%vms] should be at least as 5 times as --heartbeat-interval[%vms]", c.ElectionMs, c.TickMs)
	}
	if c.ElectionMs > maxElectionMs {
		return fmt.Errorf("--election-timeout[%vms] is too long, and should be set less than %vms", c.ElectionMs, maxElectionMs)
	}
	switch c.AutoCompactionMode {
	case compactModePeriodic, compactModeRevision:
	case "":
		return errors.New("undefined auto-compaction-mode")
	default:
		return fmt.Errorf("unknown auto-compaction-mode %q", c.AutoCompactionMode)
	}
	if err := c.validateFeatures(); err != nil {
		return err
	}
	return c.validateTLSVersions()
}

// validateURLs: listen URLs bind to an IP or localhost; advertised URLs
// are host:port.
func (c *etcdConfig) validateURLs() error {
	for _, us := range [][]url.URL{c.ListenPeerURLs, c.ListenClientURLs, c.ListenClientHTTPURLs, c.ListenMetricsURLs} {
		if err := checkBindURLs(us); err != nil {
			return err
		}
	}
	if err := checkHostURLs(c.AdvertisePeerURLs); err != nil {
		return fmt.Errorf(`--initial-advertise-peer-urls %q must be "host:port" (%w)`, strings.Join(urlList(c.AdvertisePeerURLs), ","), err)
	}
	if err := checkHostURLs(c.AdvertiseClientURLs); err != nil {
		return fmt.Errorf(`--advertise-client-urls %q must be "host:port" (%w)`, strings.Join(urlList(c.AdvertiseClientURLs), ","), err)
	}
	return nil
}

func checkBindURLs(us []url.URL) error {
	for _, u := range us {
		if u.Scheme == "unix" || u.Scheme == "unixs" {
			continue
		}
		host, _, err := net.SplitHostPort(u.Host)
		if err != nil {
			return err
		}
		if host != "localhost" && net.ParseIP(host) == nil {
			return fmt.Errorf("expected IP in URL for binding (%s)", u.String())
		}
	}
	return nil
}

func checkHostURLs(us []url.URL) error {
	for _, u := range us {
		host, _, err := net.SplitHostPort(u.Host)
		if err != nil {
			return err
		}
		if host == "" {
			return fmt.Errorf("unexpected empty host (%s)", u.String())
		}
	}
	return nil
}

// validateBootstrap is etcd's check of its cluster bootstrap settings,
// which fdb-etcd does not use.
func (c *etcdConfig) validateBootstrap() error {
	n := 0
	for _, set := range []bool{c.Durl != "", c.InitialCluster != "", c.DNSCluster != "", len(c.Discovery.Endpoints) > 0} {
		if set {
			n++
		}
	}
	if c.ClusterState != "new" && c.ClusterState != "existing" {
		return fmt.Errorf("unexpected clusterState %q", c.ClusterState)
	}
	if n > 1 {
		return errors.New(`multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery", "discovery-endpoints" or "discovery-srv"`)
	}
	d := &c.Discovery
	v3 := len(d.Endpoints) > 0 || d.Token != "" || d.Secure.Cert != "" || d.Secure.Key != "" || d.Secure.Cacert != "" ||
		d.Auth.Username != "" || d.Auth.Password != ""
	if c.Dproxy != "" && v3 {
		return errors.New("both v2 discovery settings (discovery, discovery-proxy) and v3 discovery settings (discovery-token, discovery-endpoints, discovery-cert, discovery-key, discovery-cacert, discovery-user, discovery-password) are set")
	}
	if (d.Token != "") != (len(d.Endpoints) > 0) {
		return errors.New("both --discovery-token and --discovery-endpoints must be set")
	}
	for _, ep := range d.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return errors.New("--discovery-endpoints must not contain empty endpoints")
		}
	}
	return nil
}

// validateFeatures is etcd's check of tracing and lease checkpoint
// settings, and of the hash check period.
func (c *etcdConfig) validateFeatures() error {
	if c.EnableTracing {
		if r := c.TracingSamplingRate; r < 0 {
			return errors.New("distributed tracing configurition is not valid: (tracing sampling rate must be positive)")
		} else if r > 1000000 {
			return errors.New("distributed tracing configurition is not valid: (tracing sampling rate must be less than 1000000)")
		}
	}
	if c.FeatureGates.enabled("LeaseCheckpointPersist") && !c.FeatureGates.enabled("LeaseCheckpoint") {
		return errors.New("enabling feature gate LeaseCheckpointPersist requires enabling feature gate LeaseCheckpoint")
	}
	if c.ExpCompactHashCheckTime <= 0 {
		return fmt.Errorf("--experimental-compact-hash-check-time must be >0 (set to %v)", c.ExpCompactHashCheckTime)
	}
	if c.CompactHashCheckTime <= 0 {
		return fmt.Errorf("--compact-hash-check-time must be >0 (set to %v)", c.CompactHashCheckTime)
	}
	return nil
}

func (c *etcdConfig) validateTLSVersions() error {
	minV, err := tlsutil.GetTLSVersion(c.TLSMinVersion)
	if err != nil {
		return err
	}
	maxV, err := tlsutil.GetTLSVersion(c.TLSMaxVersion)
	if err != nil {
		return err
	}
	if maxV != 0 && minV > maxV {
		return fmt.Errorf("min version (%s) is greater than max version (%s)", c.TLSMinVersion, c.TLSMaxVersion)
	}
	if minV == tls.VersionTLS13 && len(c.CipherSuites) > 0 {
		return errors.New("cipher suites cannot be configured when only TLS1.3 is enabled")
	}
	return nil
}

// applyRenames copies each explicitly set experimental value to the flag
// that replaces it, and checks the two names of the slow-request warning,
// as etcd's main does after validating.
func (c *etcdConfig) applyRenames() error {
	x := &c.experimentalConfig
	pairs := []struct {
		old  string
		from func()
	}{
		{"experimental-compact-hash-check-time", func() { x.CompactHashCheckTime = x.ExpCompactHashCheckTime }},
		{"experimental-corrupt-check-time", func() { x.CorruptCheckTime = x.ExpCorruptCheckTime }},
		{"experimental-compaction-batch-limit", func() { x.CompactionBatchLimit = x.ExpCompactionBatchLimit }},
		{"experimental-watch-progress-notify-interval", func() { x.WatchProgressNotifyInterval = x.ExpWatchProgressNotify }},
		{"experimental-warning-apply-duration", func() { x.WarningApplyDuration = x.ExpWarningApplyDuration }},
		{"experimental-bootstrap-defrag-threshold-megabytes", func() { x.BootstrapDefragThreshold = x.ExpBootstrapDefragThreshold }},
		{"experimental-memory-mlock", func() { x.MemoryMlock = x.ExpMemoryMlock }},
		{"experimental-snapshot-catchup-entries", func() { c.SnapshotCatchUpEntries = c.ExpSnapshotCatchUp }},
		{"experimental-compaction-sleep-interval", func() { x.CompactionSleepInterval = x.ExpCompactionSleepInterval }},
		{"experimental-downgrade-check-time", func() { x.DowngradeCheckTime = x.ExpDowngradeCheckTime }},
		{"experimental-peer-skip-client-san-verification", func() { c.PeerTLS.SkipClientSANVerify = c.ExpPeerSkipSANVerify }},
		{"experimental-enable-distributed-tracing", func() { c.EnableTracing = c.ExpEnableTracing }},
	}
	for _, p := range pairs {
		if c.explicit[p.old] {
			p.from()
		}
	}
	if x.ExpWarningUnaryRequest != 0 && x.WarningUnaryRequestDuration != 0 {
		return errors.New("both --experimental-warning-unary-request-duration and --warning-unary-request-duration flags are set. Use only --warning-unary-request-duration")
	}
	return nil
}
