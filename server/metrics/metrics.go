// Package metrics is fdb-etcd's Prometheus instrumentation: one registry per
// server, gRPC server metrics under go-grpc-prometheus' names (which etcd
// exposes), etcd's own metric names wherever they mean the same thing, so
// that existing etcd dashboards and alerts work, and fdb-etcd's own metrics
// under the fdb_etcd_ prefix.
//
// Nothing here is global. The server creates a Metrics with New and hands it
// (or its hook methods) to the layers that report: the storage wrapper
// (WrapStorage), the revision sequencer (ObserveBatch, as
// revision.Config.Observe), and the watch and lease services through the
// hook methods below. Every hook method is safe on a nil *Metrics, so a
// package can call them unconditionally and tests can pass nil.
//
// Hooks for the watch service:
//
//	m.SetWatchSource(func() metrics.WatchStats)  // read at scrape time
//	m.ProgressNotifySent(n)                      // per progress notification sent
//	m.WatchEventsSent(n)                         // per event sent to a watcher
//
// Hooks for the lease service:
//
//	m.LeaseGranted(), m.LeaseRevoked(), m.LeaseRenewed()
//	m.LeaseExpired(n)          // leases this member expired (as the fenced owner)
//	m.SetLeaseOwner(bool)      // whether this member currently owns expiry
//
// Compaction:
//
//	m.ObserveCompaction(took, keys) // one physical compaction run
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options describe the server being measured.
type Options struct {
	// ServerVersion is the etcd version the server reports
	// (etcd_server_version{server_version}).
	ServerVersion string
	// ClusterVersion is the etcd cluster version (major.minor).
	ClusterVersion string
	// BuildVersion is fdb-etcd's own version (fdb_etcd_build_info).
	BuildVersion string
	// ScrapeTimeout bounds the store reads done at scrape time; 0 means 2 s.
	ScrapeTimeout time.Duration
}

// StoreSource is read at scrape time: the current and compacted revisions
// (mvcc.Store implements it).
type StoreSource interface {
	Rev(ctx context.Context) (rev, compacted int64, err error)
}

// SizeSource is read at scrape time for the database size (storage.Sizer).
type SizeSource interface {
	Size() (int64, error)
}

// WatchStats is what the watch hub reports at scrape time.
type WatchStats struct {
	// CommittedRev is the newest revision committed to the store that the
	// hub knows of; DispatchedRev the newest it has delivered to every
	// synced watcher. Their difference is the hub's lag.
	CommittedRev, DispatchedRev int64
	// Watchers by state: synced (at the tail), unsynced (catching up from
	// history) and lagging (their stream's queue was full; etcd's victims).
	Synced, Unsynced, Lagging int
	// Streams is the number of open Watch streams; QueuedBytes the event
	// bytes queued on them, waiting for their clients to read them.
	Streams, QueuedBytes int
	// Progress requests answered from memory, after a read of the head,
	// and second notifications at a newer head that followed an answer
	// from memory.
	ProgressFromMemory, ProgressAfterRead, ProgressFollowUps int64
	// The hub's reads of new revisions: from the store's log tail in
	// memory, and from storage.
	ReadsFromMemory, ReadsFromStorage int64
}

// Metrics is one server's instrumentation.
type Metrics struct {
	opt Options
	reg *prometheus.Registry

	grpc    *grpcMetrics
	storage *storageMetrics

	putTotal, deleteTotal, rangeTotal, txnTotal prometheus.Counter

	batchRequests, batchBytes, batchSeconds prometheus.Histogram

	compactionSeconds prometheus.Histogram
	compactionKeys    prometheus.Counter

	progressSent, eventsSent prometheus.Counter

	leaseGranted, leaseRevoked, leaseRenewed prometheus.Counter
	leaseExpired, etcdLeaseExpired           prometheus.Counter
	leaseOwner                               prometheus.Gauge
	forwardedWrites                          *prometheus.CounterVec

	mu           sync.Mutex
	store        StoreSource
	sizer        SizeSource
	watchFn      func() WatchStats
	commitFeedFn func() int64
}

// New creates the metrics of one server, on a registry of their own that
// also carries the Go runtime and process collectors (as etcd's does).
func New(opt Options) *Metrics {
	if opt.ScrapeTimeout <= 0 {
		opt.ScrapeTimeout = 2 * time.Second
	}
	reg := prometheus.NewRegistry()
	m := &Metrics{opt: opt, reg: reg}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	f := factory{reg}
	m.grpc = newGRPCMetrics(f)
	m.storage = newStorageMetrics(f)

	// etcd's static server metrics.
	f.gauge(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "is_leader",
		Help: "Whether or not this member is a leader. fdb-etcd: every member accepts writes, so 1."}).Set(1)
	f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "server", Name: "leader_changes_seen_total",
		Help: "The number of leader changes seen. fdb-etcd has no leader election: always 0."})
	f.gaugeVec(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "version",
		Help: "Which version is running. 1 for 'server_version' label with current version."},
		[]string{"server_version"}).WithLabelValues(opt.ServerVersion).Set(1)
	if opt.ClusterVersion != "" {
		f.gaugeVec(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "cluster", Name: "version",
			Help: "Which version is running. 1 for 'cluster_version' label with current cluster version"},
			[]string{"cluster_version"}).WithLabelValues(opt.ClusterVersion).Set(1)
	}
	f.gaugeVec(prometheus.GaugeOpts{Namespace: "fdb_etcd", Name: "build_info",
		Help: "fdb-etcd's version and the etcd version it reports; always 1."},
		[]string{"version", "etcd_version"}).WithLabelValues(opt.BuildVersion, opt.ServerVersion).Set(1)

	// etcd's mvcc operation counters, fed by the gRPC interceptor.
	m.rangeTotal = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "mvcc", Name: "range_total",
		Help: "Total number of ranges seen by this member."})
	m.putTotal = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "mvcc", Name: "put_total",
		Help: "Total number of puts seen by this member."})
	m.deleteTotal = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "mvcc", Name: "delete_total",
		Help: "Total number of deletes seen by this member."})
	m.txnTotal = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "mvcc", Name: "txn_total",
		Help: "Total number of txns seen by this member."})

	// Group commit.
	m.batchRequests = f.histogram(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "revision", Name: "batch_requests",
		Help:    "Write requests group-committed in one storage transaction.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11)})
	m.batchBytes = f.histogram(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "revision", Name: "batch_bytes",
		Help:    "Bytes written by one group-committed storage transaction.",
		Buckets: prometheus.ExponentialBuckets(256, 4, 9)})
	m.batchSeconds = f.histogram(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "revision", Name: "batch_commit_duration_seconds",
		Help:    "Time from starting a batch's storage transaction to its durable commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})

	// Compaction.
	m.compactionSeconds = f.histogram(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "mvcc", Name: "compaction_duration_seconds",
		Help:    "Duration of one physical compaction run.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	m.compactionKeys = f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "mvcc", Name: "compaction_keys_total",
		Help: "Keys whose history physical compaction cleaned up."})

	// Watch.
	m.progressSent = f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "watch", Name: "progress_notifications_sent_total",
		Help: "Progress notifications sent to watch streams."})
	m.eventsSent = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "debugging_mvcc", Name: "events_total",
		Help: "Total number of events sent by this member."})

	// Leases.
	m.leaseGranted = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "debugging_lease", Name: "granted_total",
		Help: "The total number of granted leases."})
	m.leaseRevoked = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "debugging_lease", Name: "revoked_total",
		Help: "The total number of revoked leases."})
	m.leaseRenewed = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "debugging_lease", Name: "renewed_total",
		Help: "The number of renewed leases seen by the leader."})
	m.etcdLeaseExpired = f.counter(prometheus.CounterOpts{Namespace: "etcd", Subsystem: "debugging_server", Name: "lease_expired_total",
		Help: "The total number of expired leases."})
	m.leaseExpired = f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "lease", Name: "expired_total",
		Help: "Leases this member expired while owning lease expiry."})
	m.leaseOwner = f.gauge(prometheus.GaugeOpts{Namespace: "fdb_etcd", Subsystem: "lease", Name: "expiry_owner",
		Help: "1 while this member holds the fenced ownership of writes and lease expiry."})
	m.forwardedWrites = f.counterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "forward", Name: "writes_total",
		Help: "Writes (and revokes, compactions) sent on to the replica that owns writes, by result: ok, error (the owner's own answer), lost (outcome unknown), local (owner unreachable, committed here), yielded (a write committing here gave way to an owner it could reach, and was sent there)."}, []string{"result"})

	reg.MustRegister(&scrapeCollector{m: m})
	return m
}

// Registry returns the server's registry, for packages that register
// collectors of their own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetStore sets what is read at scrape time for the revision and size
// gauges. Either may be nil.
func (m *Metrics) SetStore(store StoreSource, sizer SizeSource) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.store, m.sizer = store, sizer
	m.mu.Unlock()
}

// SetWatchSource registers the watch hub's statistics, read at scrape time.
func (m *Metrics) SetWatchSource(f func() WatchStats) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.watchFn = f
	m.mu.Unlock()
}

// SetCommitFeed sets where the newest revision the write owner's commit
// feed reported to this replica (server/commitfeed) is read at scrape time.
func (m *Metrics) SetCommitFeed(revision func() int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.commitFeedFn = revision
	m.mu.Unlock()
}

// ObserveBatch is revision.Config.Observe: one committed group-commit batch.
func (m *Metrics) ObserveBatch(requests, bytes int, took time.Duration) {
	if m == nil {
		return
	}
	m.batchRequests.Observe(float64(requests))
	m.batchBytes.Observe(float64(bytes))
	m.batchSeconds.Observe(took.Seconds())
}

// ObserveCompaction records one physical compaction run.
func (m *Metrics) ObserveCompaction(took time.Duration, keys int) {
	if m == nil {
		return
	}
	m.compactionSeconds.Observe(took.Seconds())
	m.compactionKeys.Add(float64(keys))
}

// ProgressNotifySent counts progress notifications sent to watch streams.
func (m *Metrics) ProgressNotifySent(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.progressSent.Add(float64(n))
}

// WatchEventsSent counts events delivered to watchers.
func (m *Metrics) WatchEventsSent(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.eventsSent.Add(float64(n))
}

// LeaseGranted counts one granted lease.
func (m *Metrics) LeaseGranted() {
	if m != nil {
		m.leaseGranted.Inc()
	}
}

// LeaseRevoked counts one revoked lease (by request or by expiry).
func (m *Metrics) LeaseRevoked() {
	if m != nil {
		m.leaseRevoked.Inc()
	}
}

// LeaseRenewed counts one keep-alive that renewed a lease.
func (m *Metrics) LeaseRenewed() {
	if m != nil {
		m.leaseRenewed.Inc()
	}
}

// LeaseExpired counts leases this member expired.
func (m *Metrics) LeaseExpired(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.leaseExpired.Add(float64(n))
	m.etcdLeaseExpired.Add(float64(n))
}

// ForwardedWrite counts one write forwarded to the revision owner.
func (m *Metrics) ForwardedWrite(result string) {
	if m == nil {
		return
	}
	m.forwardedWrites.WithLabelValues(result).Inc()
}

// SetLeaseOwner reports whether this member owns lease expiry.
func (m *Metrics) SetLeaseOwner(owner bool) {
	if m == nil {
		return
	}
	if owner {
		m.leaseOwner.Set(1)
	} else {
		m.leaseOwner.Set(0)
	}
}

// factory registers what it creates.
type factory struct{ reg *prometheus.Registry }

func (f factory) counter(o prometheus.CounterOpts) prometheus.Counter {
	c := prometheus.NewCounter(o)
	f.reg.MustRegister(c)
	return c
}

func (f factory) counterVec(o prometheus.CounterOpts, labels []string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(o, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(o prometheus.GaugeOpts) prometheus.Gauge {
	g := prometheus.NewGauge(o)
	f.reg.MustRegister(g)
	return g
}

func (f factory) gaugeVec(o prometheus.GaugeOpts, labels []string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(o, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(o prometheus.HistogramOpts) prometheus.Histogram {
	h := prometheus.NewHistogram(o)
	f.reg.MustRegister(h)
	return h
}

func (f factory) histogramVec(o prometheus.HistogramOpts, labels []string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(o, labels)
	f.reg.MustRegister(h)
	return h
}
