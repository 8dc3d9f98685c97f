package metrics

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// RetryReporter is implemented by a backend whose retry loop can say why it
// retried (the FoundationDB backend learns it from the error it hands to
// OnError). WrapStorage registers ObserveRetry with it; reasons are then
// counted exactly. Without it the wrapper classifies only the retryable
// errors that the transaction function itself returned, which on the
// embedded backend is all of them.
type RetryReporter interface {
	// SetRetryObserver installs f, called once per retried attempt with the
	// error that caused the retry. It is called before any transaction runs.
	SetRetryObserver(f func(err error))
}

type storageMetrics struct {
	duration *prometheus.HistogramVec
	attempts *prometheus.HistogramVec
	retries  *prometheus.CounterVec
	reasons  *prometheus.CounterVec
	conflict prometheus.Counter
	unknown  prometheus.Counter
	tooOld   prometheus.Counter
	waits    prometheus.Counter

	// backendReports is set once the backend reports retry reasons itself
	// (RetryReporter, or the first ObserveFDBRetry): the wrapper then stops
	// classifying, so that no retry is counted twice.
	backendReports atomic.Bool

	// FoundationDB's client, as storage/fdb measures it.
	fdbRetries     *prometheus.CounterVec
	fdbCommit      *prometheus.HistogramVec
	fdbCommitOK    prometheus.Observer
	fdbCommitError prometheus.Observer
	fdbGRV         prometheus.Histogram
	fdbRecoveries  prometheus.Counter
}

func newStorageMetrics(f factory) *storageMetrics {
	s := &storageMetrics{
		duration: f.histogramVec(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "transaction_duration_seconds",
			Help:    "Latency of storage transactions, including retries, by kind (update, view) and result (ok, error).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17)}, []string{"kind", "result"}),
		attempts: f.histogramVec(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "transaction_attempts",
			Help:    "Attempts one storage transaction took (1 when it did not retry).",
			Buckets: []float64{1, 2, 3, 5, 8, 13, 21}}, []string{"kind"}),
		retries: f.counterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "transaction_retries_total",
			Help: "Storage transaction attempts that were run again, by kind."}, []string{"kind"}),
		reasons: f.counterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "retry_reasons_total",
			Help: "Retried storage transaction attempts by reason (conflict, commit_unknown_result, too_old, other)."}, []string{"reason"}),
		conflict: f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "conflicts_total",
			Help: "Storage transactions that did not commit because of a conflict (FoundationDB error 1020)."}),
		unknown: f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "commit_unknown_results_total",
			Help: "Storage commits whose outcome was unknown (FoundationDB error 1021) and were retried idempotently."}),
		tooOld: f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "transaction_too_old_total",
			Help: "Storage transactions that outlived the 5 s limit (FoundationDB error 1007)."}),
		waits: f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "storage", Name: "wait_change_total",
			Help: "WaitChange calls (watches on a storage key) started."}),
	}
	s.fdbRetries = f.counterVec(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "fdb", Name: "transaction_retries_total",
		Help: "FoundationDB transaction attempts retried, by FoundationDB error code (1020 conflict, 1021 commit_unknown_result, 1007 transaction_too_old, 1009 future_version, 1037 process_behind, 1213 tag_throttled, ...)."}, []string{"code"})
	s.fdbCommit = f.histogramVec(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "fdb", Name: "commit_duration_seconds",
		Help:    "Latency of FoundationDB commits (one attempt each), by result (ok, error).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"result"})
	s.fdbCommitOK, s.fdbCommitError = s.fdbCommit.WithLabelValues("ok"), s.fdbCommit.WithLabelValues("error")
	s.fdbGRV = f.histogram(prometheus.HistogramOpts{Namespace: "fdb_etcd", Subsystem: "fdb", Name: "read_version_duration_seconds",
		Help:    "Time one FoundationDB transaction attempt waited for its read version (GRV).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)})
	s.fdbRecoveries = f.counter(prometheus.CounterOpts{Namespace: "fdb_etcd", Subsystem: "fdb", Name: "recoveries_seen_total",
		Help: "FoundationDB recoveries this member noticed: read versions that jumped past what elapsed time explains (a recovery advances the version by 100 M)."})
	for _, r := range []string{"conflict", "commit_unknown_result", "too_old", "other"} {
		s.reasons.WithLabelValues(r)
	}
	for _, k := range []string{"update", "view"} {
		s.retries.WithLabelValues(k)
	}
	return s
}

// ObserveRetry classifies one retried attempt. Backends that implement
// RetryReporter have it installed; it can also be called directly.
func (m *Metrics) ObserveRetry(err error) {
	if m == nil {
		return
	}
	s := m.storage
	reason := "other"
	switch {
	case errors.Is(err, storage.ErrNotCommitted):
		reason = "conflict"
		s.conflict.Inc()
	case errors.Is(err, storage.ErrCommitUnknownResult):
		reason = "commit_unknown_result"
		s.unknown.Inc()
	case errors.Is(err, storage.ErrTransactionTooOld):
		reason = "too_old"
		s.tooOld.Inc()
	}
	s.reasons.WithLabelValues(reason).Inc()
}

// WrapStorage returns db with every transaction measured. The wrapper keeps
// db's optional capabilities that the metrics need (storage.Sizer); hand the
// unwrapped db to code that probes for others (snapshots, defragmentation).
func (m *Metrics) WrapStorage(db storage.DB) storage.DB {
	if m == nil {
		return db
	}
	w := &measuredDB{inner: db, m: m, update: newKindSeries(m.storage, "update"), view: newKindSeries(m.storage, "view")}
	if rr, ok := db.(RetryReporter); ok {
		rr.SetRetryObserver(m.ObserveRetry)
		m.storage.backendReports.Store(true)
	}
	if sz, ok := db.(storage.Sizer); ok {
		return &measuredSizerDB{measuredDB: w, sizer: sz}
	}
	return w
}

type measuredDB struct {
	inner        storage.DB
	m            *Metrics
	update, view kindSeries
}

type measuredSizerDB struct {
	*measuredDB
	sizer storage.Sizer
}

func (d *measuredSizerDB) Size() (int64, error) { return d.sizer.Size() }

// attempt tracks one Update or View call's attempts.
type attempt struct {
	n       int
	lastErr error
}

// kindSeries are one transaction kind's series, looked up once: a small
// read is one View, and label hashing per View showed in its profile.
type kindSeries struct {
	ok, failed, attempts prometheus.Observer
	retries              prometheus.Counter
}

func newKindSeries(s *storageMetrics, kind string) kindSeries {
	return kindSeries{
		ok:       s.duration.WithLabelValues(kind, "ok"),
		failed:   s.duration.WithLabelValues(kind, "error"),
		attempts: s.attempts.WithLabelValues(kind),
		retries:  s.retries.WithLabelValues(kind),
	}
}

func (d *measuredDB) before(k *kindSeries, a *attempt) {
	a.n++
	if a.n == 1 {
		return
	}
	k.retries.Inc()
	// The backend's loop is re-running fn. If fn itself returned the
	// retryable error, it is known here; otherwise only the backend knows.
	if !d.m.storage.backendReports.Load() && a.lastErr != nil && storage.Retryable(a.lastErr) {
		d.m.ObserveRetry(a.lastErr)
	}
	a.lastErr = nil
}

func (d *measuredDB) after(k *kindSeries, start time.Time, a *attempt, err error) {
	took := time.Since(start).Seconds()
	if err != nil {
		k.failed.Observe(took)
	} else {
		k.ok.Observe(took)
	}
	if a.n > 0 {
		k.attempts.Observe(float64(a.n))
	}
}

func (d *measuredDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	start := time.Now()
	var a attempt
	err := d.inner.Update(ctx, func(tx storage.Tx) error {
		d.before(&d.update, &a)
		err := fn(tx)
		a.lastErr = err
		return err
	})
	d.after(&d.update, start, &a, err)
	return err
}

func (d *measuredDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	start := time.Now()
	var a attempt
	err := d.inner.View(ctx, func(tx storage.ReadTx) error {
		d.before(&d.view, &a)
		err := fn(tx)
		a.lastErr = err
		return err
	})
	d.after(&d.view, start, &a, err)
	return err
}

func (d *measuredDB) WaitChange(ctx context.Context, key, seen []byte) error {
	d.m.storage.waits.Inc()
	return d.inner.WaitChange(ctx, key, seen)
}

func (d *measuredDB) Close() error { return d.inner.Close() }

// The methods below make a *Metrics the storage/fdb Observer (the server
// installs it on the FoundationDB backend).

// ObserveFDBRetry counts one retried FoundationDB attempt by error code and
// classifies it (conflict, commit unknown, too old). The backend reports
// every retry, including those its transaction function returned, so the
// storage wrapper stops classifying from here on.
func (m *Metrics) ObserveFDBRetry(code int, err error) {
	if m == nil {
		return
	}
	m.storage.backendReports.Store(true)
	m.storage.fdbRetries.WithLabelValues(strconv.Itoa(code)).Inc()
	m.ObserveRetry(err)
}

// ObserveFDBCommit records one FoundationDB commit's latency.
func (m *Metrics) ObserveFDBCommit(took time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.storage.fdbCommitError.Observe(took.Seconds())
		return
	}
	m.storage.fdbCommitOK.Observe(took.Seconds())
}

// ObserveFDBReadVersion records how long one attempt waited for its read
// version.
func (m *Metrics) ObserveFDBReadVersion(took time.Duration) {
	if m != nil {
		m.storage.fdbGRV.Observe(took.Seconds())
	}
}

// ObserveFDBRecovery counts one FoundationDB recovery this member noticed.
func (m *Metrics) ObserveFDBRecovery() {
	if m != nil {
		m.storage.fdbRecoveries.Inc()
	}
}
