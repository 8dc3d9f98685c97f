package tenant

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
)

// OtherTenants is the label of the tenants past the metrics limit, whose
// series are summed.
const OtherTenants = "_other"

// DefaultMetricsLimit is how many tenants get series of their own unless
// Config.MetricsLimit says otherwise.
const DefaultMetricsLimit = 100

// Metrics are the per-tenant series of a router, labeled by tenant. The
// first limit tenants served by this replica get their own label, for the
// life of the process; the others share OtherTenants, so the series stay
// bounded whatever the number of tenants.
type Metrics struct {
	limit int

	mu     sync.Mutex
	labels map[string]struct{} // guarded by mu: tenants with their own label

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	refusals *prometheus.CounterVec
	watchers *prometheus.GaugeVec
}

func newMetrics(limit int) *Metrics {
	if limit < 0 {
		limit = 0
	}
	return &Metrics{limit: limit, labels: make(map[string]struct{}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "tenant", Name: "requests_total",
			Help: "Unary requests of a tenant's clients, by method and gRPC code."}, []string{"tenant", "grpc_method", "grpc_code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "tenant", Name: "request_duration_seconds",
			Help:    "Time to answer a tenant's unary requests.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"tenant"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "tenant", Name: "quota_refusals_total",
			Help: "Requests refused for a tenant quota: requests, keys or watchers (the byte quota counts in the tenant's NOSPACE alarm)."}, []string{"tenant", "quota"}),
		watchers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "fdb_etcd", Subsystem: "tenant", Name: "watchers",
			Help: "Open watches of a tenant on this replica."}, []string{"tenant"}),
	}
}

// label returns name's label, giving it its own while there is room.
func (m *Metrics) label(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.labels[name]; ok {
		return name
	}
	if len(m.labels) >= m.limit {
		return OtherTenants
	}
	m.labels[name] = struct{}{}
	return name
}

// series are one tenant's request series, looked up once: looking them up
// by label values per request cost most of the guard's time.
type series struct {
	m       *Metrics
	label   string
	latency prometheus.Observer
	ok      sync.Map // FullMethod -> prometheus.Counter of code OK
}

func (m *Metrics) series(label string) *series {
	return &series{m: m, label: label, latency: m.latency.WithLabelValues(label)}
}

func (s *series) request(fullMethod string, err error, took time.Duration) {
	s.latency.Observe(took.Seconds())
	if err == nil {
		if c, ok := s.ok.Load(fullMethod); ok {
			c.(prometheus.Counter).Inc()
			return
		}
	}
	method := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	code := errmap.Wire(err).Code()
	c := s.m.requests.WithLabelValues(s.label, method, code.String())
	if err == nil {
		s.ok.Store(fullMethod, c)
	}
	c.Inc()
}

func (m *Metrics) refused(label, quota string) { m.refusals.WithLabelValues(label, quota).Inc() }

func (m *Metrics) watchersAdd(label string, n int64) {
	m.watchers.WithLabelValues(label).Add(float64(n))
}

// The help of the series read at scrape time from running tenants.
const (
	dbSizeHelp   = "Bytes of a running tenant's keyspace (an estimate above 4 MiB, as etcd_mvcc_db_total_size_in_bytes of its own server)."
	revisionHelp = "The newest revision a running tenant's server answered with on this replica (no series for " + OtherTenants + ")."
)

// collector is the router's metrics: the tenant series and, read at
// scrape time from the tenants running on this replica, their size and
// revision.
type collector struct {
	r              *Router
	dbSize, revDsc *prometheus.Desc
}

// Collector returns the router's metrics, to register on the registry the
// process serves on its metrics URLs.
func (r *Router) Collector() prometheus.Collector {
	return &collector{r: r,
		dbSize: prometheus.NewDesc("fdb_etcd_tenant_db_size_bytes", dbSizeHelp, []string{"tenant"}, nil),
		revDsc: prometheus.NewDesc("fdb_etcd_tenant_revision", revisionHelp, []string{"tenant"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	m := c.r.metrics
	m.requests.Describe(ch)
	m.latency.Describe(ch)
	m.refusals.Describe(ch)
	m.watchers.Describe(ch)
	ch <- c.dbSize
	ch <- c.revDsc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.r.metrics
	m.requests.Collect(ch)
	m.latency.Collect(ch)
	m.refusals.Collect(ch)
	m.watchers.Collect(ch)
	sizes := map[string]float64{}
	for _, g := range c.r.runningGuards() {
		if n, err := g.db.Size(); err == nil {
			sizes[g.label] += float64(n)
		}
		if g.label != OtherTenants {
			ch <- prometheus.MustNewConstMetric(c.revDsc, prometheus.GaugeValue, float64(g.rev.Load()), g.label)
		}
	}
	for label, n := range sizes {
		ch <- prometheus.MustNewConstMetric(c.dbSize, prometheus.GaugeValue, n, label)
	}
}

// runningGuards are the guards of the tenants whose servers run.
func (r *Router) runningGuards() []*guard {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*guard
	for _, inst := range r.tenants {
		select {
		case <-inst.ready:
			if inst.err == nil && !inst.stopping {
				out = append(out, inst.guard)
			}
		default: // starting
		}
	}
	return out
}
