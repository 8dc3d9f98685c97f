package main

import (
	"flag"
)

// registerEtcdFlags adds every flag of etcd 3.6 (server/embed/config.go's
// AddFlags and server/etcdmain/config.go) to fs, bound to c, with etcd's
// names, defaults and value syntax. What each one does here is in
// flagEffects: most are honored; the raft, peer, cluster bootstrap and
// bbolt tuning flags are accepted and reported as not applicable.
func registerEtcdFlags(fs *flag.FlagSet, c *etcdConfig, m *etcdMainFlags) {
	registerMemberFlags(fs, c)
	registerClusteringFlags(fs, c)
	registerSecurityFlags(fs, c)
	registerPeerSecurityFlags(fs, c)
	registerLoggingFlags(fs, c)
	registerFeatureFlags(fs, c)
	registerTuningFlags(fs, c)
	registerTracingFlags(fs, c)
	registerEtcdMainFlags(fs, c, m)
}

const notHere = "accepted for etcd compatibility; no effect here"

func registerMemberFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.StringVar(&c.Dir, "data-dir", c.Dir, "path to the embedded store's data directory (default ${name}.etcd; with --backend=fdb only --auto-tls writes there)")
	fs.StringVar(&c.WalDir, "wal-dir", c.WalDir, notHere+" (no separate WAL)")
	fs.Var(newURLsFlag(&c.ListenPeerURLs, ""), "listen-peer-urls", notHere+" (no raft peers)")
	fs.Var(newURLsFlag(&c.ListenClientURLs, ""), "listen-client-urls", "URLs to listen on for client gRPC traffic, and HTTP unless --listen-client-http-urls is given (http, https, unix, unixs)")
	fs.Var(newURLsFlag(&c.ListenClientHTTPURLs, ""), "listen-client-http-urls", "URLs to listen on for client HTTP traffic only (health, metrics, JSON gateway); takes HTTP off --listen-client-urls")
	fs.Var(newURLsFlag(&c.ListenMetricsURLs, ""), "listen-metrics-urls", "URLs to serve /metrics and the health endpoints on")
	fs.UintVar(&c.MaxSnapFiles, "max-snapshots", c.MaxSnapFiles, notHere+" (no raft snapshots)")
	fs.UintVar(&c.MaxWalFiles, "max-wals", c.MaxWalFiles, notHere+" (no WAL files)")
	fs.StringVar(&c.Name, "name", c.Name, "human-readable name of this member")
	fs.Uint64Var(&c.SnapshotCount, "snapshot-count", c.SnapshotCount, notHere+" (no raft snapshots)")
	fs.UintVar(&c.TickMs, "heartbeat-interval", c.TickMs, "milliseconds; with --election-timeout it sets the minimum lease TTL as in etcd")
	fs.UintVar(&c.ElectionMs, "election-timeout", c.ElectionMs, "milliseconds; leases are extended by it when lease expiry changes hands")
	fs.BoolVar(&c.InitialElectionAdvance, "initial-election-tick-advance", c.InitialElectionAdvance, notHere+" (no elections)")
	fs.Int64Var(&c.QuotaBackendBytes, "quota-backend-bytes", c.QuotaBackendBytes, "refuse writes that add data and raise NOSPACE once the store would exceed this many bytes; 0 means 2 GiB, negative disables")
	fs.StringVar(&c.BackendFreelistType, "backend-bbolt-freelist-type", c.BackendFreelistType, notHere+" (no bbolt)")
	fs.DurationVar(&c.BackendBatchInterval, "backend-batch-interval", c.BackendBatchInterval, notHere+" (writes are group-committed)")
	fs.IntVar(&c.BackendBatchLimit, "backend-batch-limit", c.BackendBatchLimit, notHere+" (writes are group-committed)")
	fs.UintVar(&c.MaxTxnOps, "max-txn-ops", c.MaxTxnOps, "maximum number of operations in a transaction")
	fs.UintVar(&c.MaxRequestBytes, "max-request-bytes", c.MaxRequestBytes, "maximum client request size in bytes")
	fs.DurationVar(&c.GRPCKeepAliveMinTime, "grpc-keepalive-min-time", c.GRPCKeepAliveMinTime, "minimum interval a client should wait before pinging the server")
	fs.DurationVar(&c.GRPCKeepAliveInterval, "grpc-keepalive-interval", c.GRPCKeepAliveInterval, "frequency of server-to-client pings (0 disables)")
	fs.DurationVar(&c.GRPCKeepAliveTimeout, "grpc-keepalive-timeout", c.GRPCKeepAliveTimeout, "wait after a keepalive ping before closing a non-responsive connection")
	fs.BoolVar(&c.SocketOpts.ReusePort, "socket-reuse-port", c.SocketOpts.ReusePort, "set SO_REUSEPORT on the listeners")
	fs.BoolVar(&c.SocketOpts.ReuseAddress, "socket-reuse-address", c.SocketOpts.ReuseAddress, "set SO_REUSEADDR on the listeners")
	fs.Var(uint32Flag{&c.MaxConcurrentStreams}, "max-concurrent-streams", "maximum concurrent gRPC streams per client connection")
	fs.DurationVar(&c.RaftReadTimeout, "raft-read-timeout", c.RaftReadTimeout, notHere+" (no raft)")
	fs.DurationVar(&c.RaftWriteTimeout, "raft-write-timeout", c.RaftWriteTimeout, notHere+" (no raft)")
}

func registerClusteringFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.Var(newURLsFlag(&c.AdvertisePeerURLs, ""), "initial-advertise-peer-urls", notHere+" (no raft peers)")
	fs.Var(newURLsFlag(&c.AdvertiseClientURLs, ""), "advertise-client-urls", "client URLs of this member, listed by MemberList; the first is where other replicas forward writes")
	fs.StringVar(&c.Durl, "discovery", c.Durl, notHere+" (members join by starting)")
	fs.Var(uniqueStringsFlag{&c.Discovery.Endpoints}, "discovery-endpoints", notHere+" (members join by starting)")
	fs.StringVar(&c.Discovery.Token, "discovery-token", "", notHere)
	fs.DurationVar(&c.Discovery.DialTimeout, "discovery-dial-timeout", c.Discovery.DialTimeout, notHere)
	fs.DurationVar(&c.Discovery.RequestTimeout, "discovery-request-timeout", c.Discovery.RequestTimeout, notHere)
	fs.DurationVar(&c.Discovery.KeepAliveTime, "discovery-keepalive-time", c.Discovery.KeepAliveTime, notHere)
	fs.DurationVar(&c.Discovery.KeepAliveTimeout, "discovery-keepalive-timeout", c.Discovery.KeepAliveTimeout, notHere)
	fs.BoolVar(&c.Discovery.Secure.InsecureTransport, "discovery-insecure-transport", true, notHere)
	fs.BoolVar(&c.Discovery.Secure.InsecureSkipVerify, "discovery-insecure-skip-tls-verify", false, notHere)
	fs.StringVar(&c.Discovery.Secure.Cert, "discovery-cert", "", notHere)
	fs.StringVar(&c.Discovery.Secure.Key, "discovery-key", "", notHere)
	fs.StringVar(&c.Discovery.Secure.Cacert, "discovery-cacert", "", notHere)
	fs.StringVar(&c.Discovery.Auth.Username, "discovery-user", "", notHere)
	fs.StringVar(&c.Discovery.Auth.Password, "discovery-password", "", notHere)
	fs.StringVar(&c.Dproxy, "discovery-proxy", c.Dproxy, notHere)
	fs.StringVar(&c.DNSCluster, "discovery-srv", c.DNSCluster, notHere)
	fs.StringVar(&c.DNSClusterServiceName, "discovery-srv-name", c.DNSClusterServiceName, notHere)
	fs.StringVar(&c.InitialCluster, "initial-cluster", c.InitialCluster, notHere+" (members share the store, not a raft group)")
	fs.StringVar(&c.InitialClusterToken, "initial-cluster-token", c.InitialClusterToken, notHere)
	fs.BoolVar(&c.StrictReconfigCheck, "strict-reconfig-check", c.StrictReconfigCheck, notHere)
	fs.BoolVar(&c.PreVote, "pre-vote", c.PreVote, notHere+" (no elections)")
	fs.StringVar(&c.AutoCompactionRetention, "auto-compaction-retention", c.AutoCompactionRetention, "auto compaction retention: hours or a duration (periodic), revisions (revision); 0 disables")
	fs.StringVar(&c.AutoCompactionMode, "auto-compaction-mode", c.AutoCompactionMode, "how --auto-compaction-retention is read: periodic or revision")
	fs.BoolVar(&c.EnablePprof, "enable-pprof", false, "serve Go's profiles under /debug/pprof/ on the client port")
	fs.StringVar(&c.Metrics, "metrics", c.Metrics, "basic or extensive; the gRPC latency histograms are always exported here")
	fs.StringVar(&c.AuthToken, "auth-token", c.AuthToken, notHere+" (no auth)")
	fs.UintVar(&c.BcryptCost, "bcrypt-cost", c.BcryptCost, notHere+" (no auth)")
	fs.UintVar(&c.AuthTokenTTL, "auth-token-ttl", c.AuthTokenTTL, notHere+" (no auth)")
	fs.BoolVar(&c.EnableGRPCGateway, "enable-grpc-gateway", c.EnableGRPCGateway, "serve etcd's /v3/ JSON gateway on the client port")
	fs.BoolVar(&c.UnsafeNoFsync, "unsafe-no-fsync", false, "embedded store: do not fsync its WAL (data loss on a crash); no effect on FoundationDB")
	fs.BoolVar(&c.ForceNewCluster, "force-new-cluster", false, notHere+" (no raft membership)")
}

func registerSecurityFlags(fs *flag.FlagSet, c *etcdConfig) {
	t := &c.ClientTLS
	fs.StringVar(&t.CertFile, "cert-file", "", "client server TLS certificate (needed by https and unixs URLs)")
	fs.StringVar(&t.KeyFile, "key-file", "", "client server TLS key")
	fs.StringVar(&t.ClientCertFile, "client-cert-file", "", "certificate this member presents when it forwards writes to another (default --cert-file)")
	fs.StringVar(&t.ClientKeyFile, "client-key-file", "", "key for --client-cert-file")
	fs.BoolVar(&t.CertAuth, "client-cert-auth", false, "refuse clients without a certificate signed by --trusted-ca-file")
	fs.StringVar(&t.CRLFile, "client-crl-file", "", "refuse client certificates this revocation list names")
	fs.Var(stringsFlag{&t.AllowedHostnames}, "client-cert-allowed-hostname", "comma-separated SAN hostnames a client certificate must match one of")
	fs.StringVar(&t.TrustedCAFile, "trusted-ca-file", "", "CA bundle for client certificates")
	fs.BoolVar(&t.AutoTLS, "auto-tls", false, "serve https/unixs with a self-signed certificate generated under data-dir/fixtures/client")
	fs.UintVar(&c.SelfSignedCertValidity, "self-signed-cert-validity", 1, "validity of the --auto-tls certificate, in years")
	fs.Var(stringsFlag{&c.CipherSuites}, "cipher-suites", "comma-separated TLS 1.2 cipher suites (default Go's)")
	fs.StringVar(&c.TLSMinVersion, "tls-min-version", c.TLSMinVersion, "minimum TLS version: TLS1.2 or TLS1.3")
	fs.StringVar(&c.TLSMaxVersion, "tls-max-version", "", "maximum TLS version: TLS1.2 or TLS1.3 (empty: Go's)")
	fs.Var(corsFlag{&c.CORS}, "cors", "comma-separated origins allowed by CORS on the client port (* or empty: all)")
	fs.Var(uniqueStringsFlag{&c.HostWhitelist}, "host-whitelist", "comma-separated Host headers accepted on plain-HTTP client ports (* or empty: all)")
}

func registerPeerSecurityFlags(fs *flag.FlagSet, c *etcdConfig) {
	t := &c.PeerTLS
	fs.StringVar(&t.CertFile, "peer-cert-file", "", notHere+" (no peer port)")
	fs.StringVar(&t.KeyFile, "peer-key-file", "", notHere+" (no peer port)")
	fs.StringVar(&t.ClientCertFile, "peer-client-cert-file", "", notHere+" (no peer port)")
	fs.StringVar(&t.ClientKeyFile, "peer-client-key-file", "", notHere+" (no peer port)")
	fs.BoolVar(&t.CertAuth, "peer-client-cert-auth", false, notHere+" (no peer port)")
	fs.StringVar(&t.TrustedCAFile, "peer-trusted-ca-file", "", notHere+" (no peer port)")
	fs.BoolVar(&t.AutoTLS, "peer-auto-tls", false, notHere+" (no peer port)")
	fs.StringVar(&t.CRLFile, "peer-crl-file", "", notHere+" (no peer port)")
	fs.Var(stringsFlag{&t.AllowedCNs}, "peer-cert-allowed-cn", notHere+" (no peer port)")
	fs.Var(stringsFlag{&t.AllowedHostnames}, "peer-cert-allowed-hostname", notHere+" (no peer port)")
	fs.BoolVar(&c.ExpPeerSkipSANVerify, "experimental-peer-skip-client-san-verification", false, notHere+" (no peer port)")
	fs.BoolVar(&t.SkipClientSANVerify, "peer-skip-client-san-verification", false, notHere+" (no peer port)")
}

func registerLoggingFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.StringVar(&c.Logger, "logger", "zap", "logger: zap (the only one etcd 3.6 has)")
	fs.Var(uniqueStringsFlag{&c.LogOutputs}, "log-outputs", "comma-separated log targets: default (stderr), stderr, stdout, systemd/journal or file paths")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn, error, panic or fatal")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: json or console")
	fs.BoolVar(&c.EnableLogRotation, "enable-log-rotation", false, "rotate the one file in --log-outputs")
	fs.StringVar(&c.LogRotationConfigJSON, "log-rotation-config-json", c.LogRotationConfigJSON, "log rotation settings (maxsize MB, maxage days, maxbackups, localtime, compress)")
}
