package fdb

import (
	"sync"
	"time"
)

// Observer receives what the backend measures of FoundationDB's client,
// which the layers above cannot see: why attempts are retried, how long
// commits and read versions take, and when the cluster has recovered.
// Methods are called on transaction goroutines and must not block.
type Observer interface {
	// ObserveFDBRetry: an attempt failed with FoundationDB error code and
	// is run again; err carries the storage meaning (errors.Is
	// storage.ErrNotCommitted, ...).
	ObserveFDBRetry(code int, err error)
	// ObserveFDBCommit: one commit took took; err is its error, or nil.
	ObserveFDBCommit(took time.Duration, err error)
	// ObserveFDBReadVersion: one read version request (the GRV round trip
	// to FoundationDB's proxies, shared by the transactions that joined
	// it) took took.
	ObserveFDBReadVersion(took time.Duration)
	// ObserveFDBRecovery: a read version showed that the cluster went
	// through a recovery since the previous one.
	ObserveFDBRecovery()
}

type nopObserver struct{}

func (nopObserver) ObserveFDBRetry(int, error)            {}
func (nopObserver) ObserveFDBCommit(time.Duration, error) {}
func (nopObserver) ObserveFDBReadVersion(time.Duration)   {}
func (nopObserver) ObserveFDBRecovery()                   {}

// Recovery detection. A client is not told about recoveries, but their
// mark is in the versions it reads: outside recoveries FoundationDB's
// version advances about versionsPerSecond with wall time, and a recovery
// starts the new generation MAX_VERSIONS_IN_FLIGHT (100,000,000) versions
// past the last one the old generation committed. A read version more than
// recoveryJump ahead of what the elapsed time explains is a recovery.
const (
	versionsPerSecond = 1_000_000
	recoveryJump      = 50_000_000
)

// versionWatch remembers the newest read version seen and when.
type versionWatch struct {
	mu   sync.Mutex
	last int64     // guarded by mu; 0 before the first read version
	at   time.Time // guarded by mu; when last was seen
}

// recovered records read version rv, seen at now, and reports whether the
// cluster recovered since the previous read version. Read versions older
// than the newest seen (concurrent transactions finish out of order) say
// nothing.
func (w *versionWatch) recovered(rv int64, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rv <= w.last {
		return false
	}
	first := w.last == 0
	explained := now.Sub(w.at).Seconds() * versionsPerSecond
	jump := float64(rv-w.last) - explained
	w.last, w.at = rv, now
	return !first && jump > recoveryJump
}
