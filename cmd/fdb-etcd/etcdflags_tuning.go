package main

import (
	"flag"
	"fmt"
)

// etcdMainFlags are the flags etcd's main package adds to embed's:
// --config-file and --version, and three choice flags it keeps apart.
type etcdMainFlags struct {
	configFile   string
	printVersion bool
}

// etcdIgnoredFlags are the flags etcd 3.6 accepts and ignores silently
// (etcdmain's ignored list).
var etcdIgnoredFlags = []string{
	"cluster-active-size", "cluster-remove-delay", "cluster-sync-interval", "config", "force",
	"max-result-buffer", "max-retry-attempts", "peer-heartbeat-interval", "peer-election-timeout",
	"retry-interval", "snapshot", "v", "vv", "test.coverprofile", "test.outputdir",
}

// experimentalFeatureFlags map etcd 3.6's experimental boolean flags to the
// feature gates that replace them (server/features).
var experimentalFeatureFlags = map[string]string{
	"experimental-stop-grpc-service-on-defrag":       "StopGRPCServiceOnDefrag",
	"experimental-initial-corrupt-check":             "InitialCorruptCheck",
	"experimental-compact-hash-check-enabled":        "CompactHashCheck",
	"experimental-txn-mode-write-with-shared-buffer": "TxnModeWriteWithSharedBuffer",
	"experimental-enable-lease-checkpoint":           "LeaseCheckpoint",
	"experimental-enable-lease-checkpoint-persist":   "LeaseCheckpointPersist",
}

func registerFeatureFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.Var(featureGatesFlag{&c.FeatureGates}, "feature-gates", notHere+" (validated as etcd does: Name=true|false pairs)")
	fs.BoolVar(&c.ExpInitialCorruptCheck, "experimental-initial-corrupt-check", false, notHere)
	fs.BoolVar(&c.ExpCompactHashCheckEnabled, "experimental-compact-hash-check-enabled", false, notHere)
	fs.BoolVar(&c.ExpEnableLeaseCheckpoint, "experimental-enable-lease-checkpoint", false, notHere+" (lease deadlines are always durable)")
	fs.BoolVar(&c.ExpLeaseCheckpointPersist, "experimental-enable-lease-checkpoint-persist", false, notHere+" (lease deadlines are always durable)")
	fs.BoolVar(&c.ExpTxnModeWriteSharedBuffer, "experimental-txn-mode-write-with-shared-buffer", true, notHere)
	fs.BoolVar(&c.ExpStopGRPCServiceOnDefrag, "experimental-stop-grpc-service-on-defrag", false, notHere)
	fs.BoolVar(&c.ExpMemoryMlock, "experimental-memory-mlock", false, notHere+" (no bbolt)")
	fs.BoolVar(&c.MemoryMlock, "memory-mlock", false, notHere+" (no bbolt)")
}

func registerTuningFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.DurationVar(&c.ExpCorruptCheckTime, "experimental-corrupt-check-time", 0, notHere)
	fs.DurationVar(&c.CorruptCheckTime, "corrupt-check-time", 0, notHere)
	fs.DurationVar(&c.ExpCompactHashCheckTime, "experimental-compact-hash-check-time", c.ExpCompactHashCheckTime, notHere)
	fs.DurationVar(&c.CompactHashCheckTime, "compact-hash-check-time", c.CompactHashCheckTime, notHere)
	fs.IntVar(&c.ExpCompactionBatchLimit, "experimental-compaction-batch-limit", 0, notHere)
	fs.IntVar(&c.CompactionBatchLimit, "compaction-batch-limit", 0, notHere)
	fs.DurationVar(&c.ExpCompactionSleepInterval, "experimental-compaction-sleep-interval", 0, notHere)
	fs.DurationVar(&c.CompactionSleepInterval, "compaction-sleep-interval", 0, notHere)
	fs.DurationVar(&c.ExpWatchProgressNotify, "experimental-watch-progress-notify-interval", 0, "etcd's deprecated name for --watch-progress-notify-interval")
	fs.DurationVar(&c.WatchProgressNotifyInterval, "watch-progress-notify-interval", 0, "period of watch progress notifications (0: 10m, at least 100ms)")
	fs.DurationVar(&c.DowngradeCheckTime, "downgrade-check-time", c.DowngradeCheckTime, notHere)
	fs.DurationVar(&c.ExpDowngradeCheckTime, "experimental-downgrade-check-time", c.ExpDowngradeCheckTime, notHere)
	fs.DurationVar(&c.ExpWarningApplyDuration, "experimental-warning-apply-duration", 0, "etcd's deprecated name for --warning-apply-duration")
	fs.DurationVar(&c.WarningApplyDuration, "warning-apply-duration", c.WarningApplyDuration, "log a warning for every request slower than this (0 disables)")
	fs.DurationVar(&c.WarningUnaryRequestDuration, "warning-unary-request-duration", 0, notHere+" (slow requests are logged by --warning-apply-duration)")
	fs.DurationVar(&c.ExpWarningUnaryRequest, "experimental-warning-unary-request-duration", 0, notHere+" (slow requests are logged by --warning-apply-duration)")
	fs.UintVar(&c.ExpBootstrapDefragThreshold, "experimental-bootstrap-defrag-threshold-megabytes", 0, notHere)
	fs.UintVar(&c.BootstrapDefragThreshold, "bootstrap-defrag-threshold-megabytes", 0, notHere)
	fs.IntVar(&c.MaxLearners, "max-learners", c.MaxLearners, notHere+" (no learners)")
	fs.Uint64Var(&c.ExpSnapshotCatchUp, "experimental-snapshot-catchup-entries", c.ExpSnapshotCatchUp, notHere)
	fs.Uint64Var(&c.SnapshotCatchUpEntries, "snapshot-catchup-entries", c.SnapshotCatchUpEntries, notHere)
}

func registerTracingFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.BoolVar(&c.ExpEnableTracing, "experimental-enable-distributed-tracing", false, notHere+" (no OpenTelemetry tracing)")
	fs.BoolVar(&c.EnableTracing, "enable-distributed-tracing", false, notHere+" (no OpenTelemetry tracing)")
	fs.StringVar(&c.ExpTracingAddress, "experimental-distributed-tracing-address", c.ExpTracingAddress, notHere)
	fs.StringVar(&c.TracingAddress, "distributed-tracing-address", c.TracingAddress, notHere)
	fs.StringVar(&c.ExpTracingServiceName, "experimental-distributed-tracing-service-name", c.ExpTracingServiceName, notHere)
	fs.StringVar(&c.TracingServiceName, "distributed-tracing-service-name", c.TracingServiceName, notHere)
	fs.StringVar(&c.ExpTracingInstanceID, "experimental-distributed-tracing-instance-id", "", notHere)
	fs.StringVar(&c.TracingInstanceID, "distributed-tracing-instance-id", "", notHere)
	fs.IntVar(&c.ExpTracingSamplingRate, "experimental-distributed-tracing-sampling-rate", 0, notHere)
	fs.IntVar(&c.TracingSamplingRate, "distributed-tracing-sampling-rate", 0, notHere)
}

func registerEtcdMainFlags(fs *flag.FlagSet, c *etcdConfig, m *etcdMainFlags) {
	fs.StringVar(&m.configFile, "config-file", "", "etcd YAML configuration file; with it, other flags and ETCD_* variables are ignored, as in etcd")
	fs.Var(choiceFlag{&c.DiscoveryFallback, []string{"exit", "proxy"}}, "discovery-fallback", notHere)
	fs.Var(choiceFlag{&c.ClusterState, []string{"new", "existing"}}, "initial-cluster-state", notHere+" (members join by starting)")
	fs.Var(choicesFlag{&c.V2Deprecation, []string{"write-only", "write-only-skip-check", "write-only-drop-data", "gone"}}, "v2-deprecation", notHere+" (no v2 store)")
	fs.BoolVar(&m.printVersion, "version", false, "print the version and exit")
	for _, name := range etcdIgnoredFlags {
		fs.Var(ignoredFlag{}, name, "ignored, as etcd ignores it")
	}
}

// registerFDBEtcdFlags adds fdb-etcd's own flags (not etcd's).
func registerFDBEtcdFlags(fs *flag.FlagSet, c *etcdConfig) {
	f := &c.fdbEtcdConfig
	fs.StringVar(&f.Backend, "backend", f.Backend, "storage backend: pebble (embedded) or fdb (FoundationDB)")
	fs.StringVar(&f.FDBClusterFile, "fdb-cluster-file", f.FDBClusterFile, "FoundationDB cluster file (backend fdb)")
	fs.StringVar(&f.FDBPrefix, "fdb-prefix", f.FDBPrefix, "key prefix of this keyspace inside FoundationDB (backend fdb)")
	fs.IntVar(&f.FDBAPIVersion, "fdb-api-version", f.FDBAPIVersion, "FoundationDB client API version (backend fdb)")
	fs.BoolVar(&f.FDBForwardWrites, "fdb-forward-writes", f.FDBForwardWrites, "send writes to the one replica that currently owns revision allocation, so replicas sharing a keyspace do not conflict on it (backend fdb); peers dial each other's first --advertise-client-urls")
	fs.StringVar(&f.Tenancy, "tenancy", f.Tenancy, "none: one etcd keyspace; client-cert-cn: a keyspace per tenant, the tenant named by the client certificate's Common Name (needs --client-cert-auth and https client URLs)")
	fs.BoolVar(&f.TenantAutoCreate, "tenant-auto-create", false, "with --tenancy=client-cert-cn: create the tenant of an unknown Common Name instead of refusing it")
	fs.DurationVar(&f.TenantIdleTimeout, "tenant-idle-timeout", f.TenantIdleTimeout, "with --tenancy=client-cert-cn: stop a tenant's server this long after its last connection closed")
	fs.Var(appendStringsFlag{&f.TenantAdminCNs}, "tenant-admin-cn", "with --tenancy=client-cert-cn: a client certificate Common Name that reaches the tenant admin service instead of a tenant (repeatable, or a comma-separated list)")
	fs.IntVar(&f.TenantMetricsLimit, "tenant-metrics-limit", f.TenantMetricsLimit, "with --tenancy=client-cert-cn: how many tenants get metrics series of their own on this replica; the others are summed under tenant=\"_other\" (0: none)")
	fs.IntVar(&f.TenantMaxConcurrentRequests, "tenant-max-concurrent-requests", f.TenantMaxConcurrentRequests, "with --tenancy=client-cert-cn: how many unary requests this replica runs at once, all tenants together; the rest wait in a queue per tenant, served in turn (0: no bound, no turns)")
	fs.IntVar(&f.TenantMaxQueuedRequests, "tenant-max-queued-requests", f.TenantMaxQueuedRequests, "with --tenant-max-concurrent-requests: how many requests one tenant may have waiting; the next gets etcd's too many requests")
	fs.DurationVar(&f.TenantMaxQueueWait, "tenant-max-queue-wait", f.TenantMaxQueueWait, "with --tenant-max-concurrent-requests: how long a request waits for its turn before it gets etcd's too many requests")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", f.ShutdownTimeout, "how long SIGTERM waits for in-flight requests before closing them")
	fs.BoolVar(&f.FDBBuggify.Enable, "fdb-client-buggify", false, "TESTING AID, never in production: turn on FoundationDB's client-side fault injection (client_buggify_enable): the client library fails requests at random with retryable errors and commit_unknown_result, and delays them (backend fdb)")
	fs.IntVar(&f.FDBBuggify.SectionActivatedPercent, "fdb-client-buggify-section-activated-probability", 0, "with --fdb-client-buggify: percent chance that each fault-injection section is active in this process (0: FoundationDB's default)")
	fs.IntVar(&f.FDBBuggify.SectionFiredPercent, "fdb-client-buggify-section-fired-probability", 0, "with --fdb-client-buggify: percent chance that an active section fires each time it is reached (0: FoundationDB's default)")
}

// checkBuggify refuses client fault-injection settings that would be
// ignored or that FoundationDB would refuse.
func checkBuggify(c *fdbEtcdConfig) error {
	b := c.FDBBuggify
	if !b.Enable && (b.SectionActivatedPercent != 0 || b.SectionFiredPercent != 0) {
		return fmt.Errorf("--fdb-client-buggify-section-*-probability needs --fdb-client-buggify")
	}
	if b.Enable && c.Backend != "fdb" {
		return fmt.Errorf("--fdb-client-buggify needs --backend=fdb")
	}
	for _, p := range []int{b.SectionActivatedPercent, b.SectionFiredPercent} {
		if p < 0 || p > 100 {
			return fmt.Errorf("--fdb-client-buggify-section-*-probability: %d is not a percentage", p)
		}
	}
	return nil
}
