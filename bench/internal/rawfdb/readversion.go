package rawfdb

import (
	"sync"
	"time"
)

// RecentVersion hands out a recently obtained read version, as a client may
// for reads that need not be linearizable (etcd's serializable reads): the
// first caller after the version has aged MaxAge obtains a new one, every
// other caller reuses it without a round trip.
type RecentVersion struct {
	fetch  func() (int64, error)
	maxAge time.Duration
	now    func() time.Time

	// mu is held across a fetch, so that callers arriving meanwhile wait for
	// its version instead of each asking for one.
	mu      sync.Mutex
	version int64     // guarded by mu; 0: none yet
	at      time.Time // guarded by mu; when version was asked for
	fetches int64     // guarded by mu
}

// NewRecentVersion returns a RecentVersion that obtains versions with fetch
// and reuses each for maxAge, measured on now's clock from when it was asked
// for.
func NewRecentVersion(fetch func() (int64, error), maxAge time.Duration, now func() time.Time) *RecentVersion {
	return &RecentVersion{fetch: fetch, maxAge: maxAge, now: now}
}

// Get returns a read version no older than maxAge.
func (r *RecentVersion) Get() (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.version != 0 && r.now().Sub(r.at) < r.maxAge {
		return r.version, nil
	}
	// The age counts from before the request: the version is at least as
	// new as that moment.
	at := r.now()
	v, err := r.fetch()
	if err != nil {
		return 0, err
	}
	r.version, r.at = v, at
	r.fetches++
	return v, nil
}

// Fetches returns how many read versions were obtained.
func (r *RecentVersion) Fetches() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fetches
}
