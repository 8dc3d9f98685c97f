package mirror

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the mirror's Prometheus metrics.
type Metrics struct {
	source   prometheus.Gauge
	mirrored prometheus.Gauge
	lag      prometheus.Gauge
	apply    prometheus.Histogram
}

// NewMetrics registers the mirror's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		source: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fdb_etcd_mirror_source_revision",
			Help: "The newest revision the source etcd reported to the mirror."}),
		mirrored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fdb_etcd_mirror_revision",
			Help: "The last source revision the mirror wrote."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fdb_etcd_mirror_lag_revisions",
			Help: "Source revisions not yet written by the mirror."}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fdb_etcd_mirror_apply_seconds",
			Help:    "From a revision's arrival from the source to its commit here.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	reg.MustRegister(m.source, m.mirrored, m.lag, m.apply)
	return m
}

// applied records that revision rev is written while the source is at
// source; took < 0 means no revision was written.
func (m *Metrics) applied(rev, source int64, took time.Duration) {
	if m == nil {
		return
	}
	m.source.Set(float64(source))
	m.mirrored.Set(float64(rev))
	m.lag.Set(float64(max(source-rev, 0)))
	if took >= 0 {
		m.apply.Observe(took.Seconds())
	}
}

// lagSamples bounds the apply delays kept for the quantiles logged at stop.
const lagSamples = 4096

// lagStats keeps the last lagSamples apply delays.
type lagStats struct {
	mu      sync.Mutex
	samples []time.Duration // guarded by mu; a ring once full
	next    int             // guarded by mu
	count   int64           // guarded by mu; revisions observed
}

func (s *lagStats) observe(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	if len(s.samples) < lagSamples {
		s.samples = append(s.samples, d)
		return
	}
	s.samples[s.next] = d
	s.next = (s.next + 1) % lagSamples
}

// quantiles returns the revisions observed, and the median, the 99th
// percentile and the maximum of the samples kept.
func (s *lagStats) quantiles() (n int64, p50, p99, top time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return s.count, 0, 0, 0
	}
	sorted := append([]time.Duration(nil), s.samples...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	at := func(q float64) time.Duration { return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))] }
	return s.count, at(0.5), at(0.99), sorted[len(sorted)-1]
}
