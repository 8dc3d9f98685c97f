package main

import (
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/tenant"
)

// etcdConfig is the configuration etcd 3.6's command line, ETCD_*
// environment variables and --config-file describe (the keys of etcd's
// embed.Config), plus fdb-etcd's own settings. Flags bind to its fields and
// a config file is decoded into it, so both reach the server the same way.
// The JSON names are the config file's keys, which are the flags' names.
type etcdConfig struct {
	Name                   string        `json:"name"`
	Dir                    string        `json:"data-dir"`
	WalDir                 string        `json:"wal-dir"`
	SnapshotCount          uint64        `json:"snapshot-count"`
	SnapshotCatchUpEntries uint64        `json:"snapshot-catchup-entries"`
	ExpSnapshotCatchUp     uint64        `json:"experimental-snapshot-catch-up-entries"`
	MaxSnapFiles           uint          `json:"max-snapshots"`
	MaxWalFiles            uint          `json:"max-wals"`
	TickMs                 uint          `json:"heartbeat-interval"`
	ElectionMs             uint          `json:"election-timeout"`
	InitialElectionAdvance bool          `json:"initial-election-tick-advance"`
	BackendBatchInterval   time.Duration `json:"backend-batch-interval"`
	BackendBatchLimit      int           `json:"backend-batch-limit"`
	BackendFreelistType    string        `json:"backend-bbolt-freelist-type"`
	QuotaBackendBytes      int64         `json:"quota-backend-bytes"`
	MaxTxnOps              uint          `json:"max-txn-ops"`
	MaxRequestBytes        uint          `json:"max-request-bytes"`
	MaxConcurrentStreams   uint32        `json:"max-concurrent-streams"`
	RaftReadTimeout        time.Duration `json:"-"`
	RaftWriteTimeout       time.Duration `json:"-"`

	ListenPeerURLs       []url.URL `json:"-"`
	ListenClientURLs     []url.URL `json:"-"`
	ListenClientHTTPURLs []url.URL `json:"-"`
	ListenMetricsURLs    []url.URL `json:"-"`
	AdvertisePeerURLs    []url.URL `json:"-"`
	AdvertiseClientURLs  []url.URL `json:"-"`
	CORS                 []string  `json:"-"`
	HostWhitelist        []string  `json:"-"`

	ClientTLS              securityConfig `json:"-"`
	PeerTLS                securityConfig `json:"-"`
	SelfSignedCertValidity uint           `json:"self-signed-cert-validity"`
	CipherSuites           []string       `json:"cipher-suites"`
	TLSMinVersion          string         `json:"tls-min-version"`
	TLSMaxVersion          string         `json:"tls-max-version"`
	ExpPeerSkipSANVerify   bool           `json:"experimental-peer-skip-client-san-verification"`

	ClusterState          string          `json:"initial-cluster-state"`
	DNSCluster            string          `json:"discovery-srv"`
	DNSClusterServiceName string          `json:"discovery-srv-name"`
	Dproxy                string          `json:"discovery-proxy"`
	Durl                  string          `json:"discovery"`
	Discovery             discoveryConfig `json:"discovery-config"`
	DiscoveryFallback     string          `json:"-"`
	InitialCluster        string          `json:"initial-cluster"`
	InitialClusterToken   string          `json:"initial-cluster-token"`
	StrictReconfigCheck   bool            `json:"strict-reconfig-check"`
	PreVote               bool            `json:"pre-vote"`

	AutoCompactionMode      string `json:"auto-compaction-mode"`
	AutoCompactionRetention string `json:"auto-compaction-retention"`

	GRPCKeepAliveMinTime  time.Duration        `json:"grpc-keepalive-min-time"`
	GRPCKeepAliveInterval time.Duration        `json:"grpc-keepalive-interval"`
	GRPCKeepAliveTimeout  time.Duration        `json:"grpc-keepalive-timeout"`
	SocketOpts            transport.SocketOpts `json:"socket-options"`

	AuthToken    string `json:"auth-token"`
	BcryptCost   uint   `json:"bcrypt-cost"`
	AuthTokenTTL uint   `json:"auth-token-ttl"`

	experimentalConfig
	tracingConfig

	EnablePprof       bool         `json:"enable-pprof"`
	Metrics           string       `json:"metrics"`
	EnableGRPCGateway bool         `json:"enable-grpc-gateway"`
	UnsafeNoFsync     bool         `json:"unsafe-no-fsync"`
	ForceNewCluster   bool         `json:"force-new-cluster"`
	V2Deprecation     string       `json:"v2-deprecation"`
	FeatureGates      featureGates `json:"-"`

	Logger                string   `json:"logger"`
	LogLevel              string   `json:"log-level"`
	LogFormat             string   `json:"log-format"`
	LogOutputs            []string `json:"log-outputs"`
	EnableLogRotation     bool     `json:"enable-log-rotation"`
	LogRotationConfigJSON string   `json:"log-rotation-config-json"`

	fdbEtcdConfig

	// explicit names the settings given on the command line, in the
	// environment or in the config file (etcd's FlagsExplicitlySet).
	explicit map[string]bool
}

// experimentalConfig holds etcd 3.6's tuning flags, each experimental name
// beside the name that replaces it.
type experimentalConfig struct {
	ExpInitialCorruptCheck      bool          `json:"experimental-initial-corrupt-check"`
	ExpCorruptCheckTime         time.Duration `json:"experimental-corrupt-check-time"`
	CorruptCheckTime            time.Duration `json:"corrupt-check-time"`
	ExpCompactHashCheckEnabled  bool          `json:"experimental-compact-hash-check-enabled"`
	ExpCompactHashCheckTime     time.Duration `json:"experimental-compact-hash-check-time"`
	CompactHashCheckTime        time.Duration `json:"compact-hash-check-time"`
	ExpEnableLeaseCheckpoint    bool          `json:"experimental-enable-lease-checkpoint"`
	ExpLeaseCheckpointPersist   bool          `json:"experimental-enable-lease-checkpoint-persist"`
	ExpCompactionBatchLimit     int           `json:"experimental-compaction-batch-limit"`
	CompactionBatchLimit        int           `json:"compaction-batch-limit"`
	ExpCompactionSleepInterval  time.Duration `json:"experimental-compaction-sleep-interval"`
	CompactionSleepInterval     time.Duration `json:"compaction-sleep-interval"`
	ExpWatchProgressNotify      time.Duration `json:"experimental-watch-progress-notify-interval"`
	WatchProgressNotifyInterval time.Duration `json:"watch-progress-notify-interval"`
	ExpWarningApplyDuration     time.Duration `json:"experimental-warning-apply-duration"`
	WarningApplyDuration        time.Duration `json:"warning-apply-duration"`
	WarningUnaryRequestDuration time.Duration `json:"warning-unary-request-duration"`
	ExpWarningUnaryRequest      time.Duration `json:"experimental-warning-unary-request-duration"`
	ExpBootstrapDefragThreshold uint          `json:"experimental-bootstrap-defrag-threshold-megabytes"`
	BootstrapDefragThreshold    uint          `json:"bootstrap-defrag-threshold-megabytes"`
	MaxLearners                 int           `json:"max-learners"`
	ExpDowngradeCheckTime       time.Duration `json:"experimental-downgrade-check-time"`
	DowngradeCheckTime          time.Duration `json:"downgrade-check-time"`
	ExpMemoryMlock              bool          `json:"experimental-memory-mlock"`
	MemoryMlock                 bool          `json:"memory-mlock"`
	ExpTxnModeWriteSharedBuffer bool          `json:"experimental-txn-mode-write-with-shared-buffer"`
	ExpStopGRPCServiceOnDefrag  bool          `json:"experimental-stop-grpc-service-on-defrag"`
	PeerSkipClientSANVerify     bool          `json:"-"`
}

// tracingConfig holds etcd's distributed tracing flags.
type tracingConfig struct {
	ExpEnableTracing       bool   `json:"experimental-enable-distributed-tracing"`
	EnableTracing          bool   `json:"enable-distributed-tracing"`
	ExpTracingAddress      string `json:"experimental-distributed-tracing-address"`
	TracingAddress         string `json:"distributed-tracing-address"`
	ExpTracingServiceName  string `json:"experimental-distributed-tracing-service-name"`
	TracingServiceName     string `json:"distributed-tracing-service-name"`
	ExpTracingInstanceID   string `json:"experimental-distributed-tracing-instance-id"`
	TracingInstanceID      string `json:"distributed-tracing-instance-id"`
	ExpTracingSamplingRate int    `json:"experimental-distributed-tracing-sampling-rate"`
	TracingSamplingRate    int    `json:"distributed-tracing-sampling-rate"`
}

// fdbEtcdConfig holds the settings etcd does not have. They are flags, and
// keys of the config file too, where etcd ignores them.
type fdbEtcdConfig struct {
	Backend          string        `json:"backend"`
	FDBClusterFile   string        `json:"fdb-cluster-file"`
	FDBPrefix        string        `json:"fdb-prefix"`
	FDBAPIVersion    int           `json:"fdb-api-version"`
	FDBForwardWrites bool          `json:"fdb-forward-writes"`
	ShutdownTimeout  time.Duration `json:"shutdown-timeout"`
	// Tenancy, TenantAutoCreate and TenantIdleTimeout serve many etcd
	// keyspaces, a tenant per client certificate (package tenant).
	Tenancy           string        `json:"tenancy"`
	TenantAutoCreate  bool          `json:"tenant-auto-create"`
	TenantIdleTimeout time.Duration `json:"tenant-idle-timeout"`
	// TenantAdminCNs reach the tenant admin service; TenantMetricsLimit
	// caps the tenants with metrics series of their own.
	TenantAdminCNs     []string `json:"tenant-admin-cn"`
	TenantMetricsLimit int      `json:"tenant-metrics-limit"`
	// TenantMaxConcurrentRequests, TenantMaxQueuedRequests and
	// TenantMaxQueueWait share request evaluation out among tenants
	// (tenant.Config.Fair).
	TenantMaxConcurrentRequests int           `json:"tenant-max-concurrent-requests"`
	TenantMaxQueuedRequests     int           `json:"tenant-max-queued-requests"`
	TenantMaxQueueWait          time.Duration `json:"tenant-max-queue-wait"`
	// FDBBuggify is FoundationDB's client fault injection, a testing aid
	// given only as flags.
	FDBBuggify fdb.ClientBuggify `json:"-"`
}

// securityConfig is one of etcd's client-transport-security and
// peer-transport-security blocks.
type securityConfig struct {
	CertFile            string   `json:"cert-file"`
	KeyFile             string   `json:"key-file"`
	ClientCertFile      string   `json:"client-cert-file"`
	ClientKeyFile       string   `json:"client-key-file"`
	CertAuth            bool     `json:"client-cert-auth"`
	TrustedCAFile       string   `json:"trusted-ca-file"`
	AutoTLS             bool     `json:"auto-tls"`
	AllowedCNs          []string `json:"allowed-cn"`
	AllowedHostnames    []string `json:"allowed-hostname"`
	SkipClientSANVerify bool     `json:"skip-client-san-verification,omitempty"`
	CRLFile             string   `json:"-"`
}

// empty is etcd's TLSInfo.Empty: no server certificate.
func (s *securityConfig) empty() bool { return s.CertFile == "" && s.KeyFile == "" }

// discoveryConfig is etcd's v3 discovery settings (the discovery-config
// key of its config file).
type discoveryConfig struct {
	clientv3.ConfigSpec `json:"client"`
	Token               string `json:"token"`
}

// etcd 3.6's defaults (server/embed/config.go), and fdb-etcd's own.
const (
	defaultListenClientURL      = "http://localhost:2379"
	defaultListenPeerURL        = "http://localhost:2380"
	defaultName                 = "default"
	defaultMaxRequestBytes      = 1.5 * 1024 * 1024
	defaultMaxTxnOps            = 128
	defaultSnapshotCount        = 10000
	defaultSnapshotCatchUp      = 5000
	defaultCompactHashCheckTime = time.Minute
	defaultDowngradeCheckTime   = 5 * time.Second
	defaultMaxLearners          = 1
	defaultBcryptCost           = 10
	defaultLogRotationConfig    = `{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}`
	defaultTracingAddress       = "localhost:4317"
	defaultTracingServiceName   = "etcd"
)

// newEtcdConfig returns etcd's defaults (embed.NewConfig), and
// fdb-etcd's for its own settings.
func newEtcdConfig() *etcdConfig {
	lc, _ := url.Parse(defaultListenClientURL)
	lp, _ := url.Parse(defaultListenPeerURL)
	c := &etcdConfig{
		Name: defaultName, SnapshotCount: defaultSnapshotCount,
		SnapshotCatchUpEntries: defaultSnapshotCatchUp, ExpSnapshotCatchUp: defaultSnapshotCatchUp,
		MaxSnapFiles: 5, MaxWalFiles: 5, TickMs: 100, ElectionMs: 1000, InitialElectionAdvance: true,
		MaxTxnOps: defaultMaxTxnOps, MaxRequestBytes: defaultMaxRequestBytes, MaxConcurrentStreams: 1<<32 - 1,
		RaftReadTimeout: 5 * time.Second, RaftWriteTimeout: 5 * time.Second,
		ListenPeerURLs: []url.URL{*lp}, AdvertisePeerURLs: []url.URL{*lp},
		ListenClientURLs: []url.URL{*lc}, AdvertiseClientURLs: []url.URL{*lc},
		CORS: []string{"*"}, HostWhitelist: []string{"*"},
		SelfSignedCertValidity: 1, TLSMinVersion: "TLS1.2",
		ClusterState: "new", InitialClusterToken: "etcd-cluster", StrictReconfigCheck: true, PreVote: true,
		DiscoveryFallback:  "exit",
		AutoCompactionMode: "periodic", AutoCompactionRetention: "0",
		GRPCKeepAliveMinTime: 5 * time.Second, GRPCKeepAliveInterval: 2 * time.Hour, GRPCKeepAliveTimeout: 20 * time.Second,
		AuthToken: "simple", BcryptCost: defaultBcryptCost, AuthTokenTTL: 300,
		Metrics: "basic", EnableGRPCGateway: true,
		Logger: "zap", LogLevel: "info", LogFormat: "json", LogOutputs: []string{logOutputDefault},
		LogRotationConfigJSON: defaultLogRotationConfig,
		FeatureGates:          featureGates{},
		explicit:              map[string]bool{},
	}
	c.Discovery.DialTimeout, c.Discovery.RequestTimeout = 2*time.Second, 5*time.Second
	c.Discovery.KeepAliveTime, c.Discovery.KeepAliveTimeout = 2*time.Second, 6*time.Second
	c.Discovery.Secure = &clientv3.SecureConfig{InsecureTransport: true}
	c.Discovery.Auth = &clientv3.AuthConfig{}
	c.InitialCluster = c.Name + "=" + defaultListenPeerURL
	c.experimentalConfig = experimentalConfig{
		CompactHashCheckTime: defaultCompactHashCheckTime, ExpCompactHashCheckTime: defaultCompactHashCheckTime,
		WarningApplyDuration: 100 * time.Millisecond, ExpTxnModeWriteSharedBuffer: true,
		DowngradeCheckTime: defaultDowngradeCheckTime, ExpDowngradeCheckTime: defaultDowngradeCheckTime,
		MaxLearners: defaultMaxLearners,
	}
	c.tracingConfig = tracingConfig{
		ExpTracingAddress: defaultTracingAddress, TracingAddress: defaultTracingAddress,
		ExpTracingServiceName: defaultTracingServiceName, TracingServiceName: defaultTracingServiceName,
	}
	c.fdbEtcdConfig = fdbEtcdConfig{Backend: "pebble", FDBClusterFile: "/etc/foundationdb/fdb.cluster",
		FDBPrefix: "fdb-etcd", FDBAPIVersion: 730, FDBForwardWrites: true, ShutdownTimeout: 10 * time.Second,
		Tenancy: tenancyNone, TenantIdleTimeout: tenant.DefaultIdleTimeout, TenantMetricsLimit: tenant.DefaultMetricsLimit,
		TenantMaxQueuedRequests: fairsched.DefaultQueue, TenantMaxQueueWait: fairsched.DefaultMaxWait}
	return c
}
