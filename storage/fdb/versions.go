//go:build fdb

package fdb

import (
	"context"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// DefaultRecentVersionAge is how old a read version a storage.Recent View
// may reuse: well under the time FoundationDB needs to commit anything
// (1.5 ms and more), so such a read is behind the latest snapshot by a
// commit or two at most.
const DefaultRecentVersionAge = 5 * time.Millisecond

// DefaultWriteVersionAge is how old a read version the first attempt of an
// Update may reuse: a write that read at an older version than the latest
// is still checked for conflicts up to its commit, so the age only bounds
// the conflicts it risks and keeps the transaction far from FoundationDB's
// five seconds.
const DefaultWriteVersionAge = 100 * time.Millisecond

// Read versions are shared. Every transaction needs one (a GRV round trip
// to the proxies), and with many concurrent requests most of them would ask
// within the same fraction of a millisecond. So the transactions that start
// while no read version request is being prepared join one (versionBatch),
// which is sent once they have joined: its answer is at least as new as
// every commit that completed before any of them started, which is all a
// linearizable read asks of its own GRV. One request is in flight at a
// time; those arriving meanwhile join the next one, sent as soon as the
// answer comes.
//
// A storage.Recent View goes further and reuses the newest version this
// DB has seen (read version or commit version) if it was the latest at
// most RecentVersionAge ago.

// versionBatch is one read version request and the transactions waiting
// for it.
type versionBatch struct {
	done chan struct{} // closed once v and err are set
	v    int64
	err  error
}

// versionSharing batches the read version requests of a DB.
type versionSharing struct {
	mu      sync.Mutex
	next    *versionBatch // guarded by mu; not sent yet, open to joiners
	sending bool          // guarded by mu; a fetcher goroutine runs
	// fetchers counts the fetcher goroutine, which Close waits for.
	fetchers sync.WaitGroup
}

// latestKnown is the newest version a DB has read at or committed, and
// when it was last known to be the latest (a read version at least as new
// as the cluster's latest commit when it was requested).
type latestKnown struct {
	mu sync.Mutex
	v  int64     // guarded by mu
	at time.Time // guarded by mu
}

// saw records version v, known at at to be no older than the latest.
func (l *latestKnown) saw(v int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v > l.v {
		l.v = v
	}
	// A version older than the newest seen, requested later, still shows
	// that nothing newer than the newest had committed by then.
	if at.After(l.at) {
		l.at = at
	}
}

// recent returns the newest version if it was the latest within maxAge
// before now.
func (l *latestKnown) recent(now time.Time, maxAge time.Duration) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v, l.v > 0 && now.Sub(l.at) <= maxAge
}

// attemptAt is the read version an attempt reads at, and whether it was
// reused instead of requested for it.
type attemptAt struct {
	v      int64
	reused bool
}

// attemptVersion sets tr's read version for an attempt (readVersion).
func (d *DB) attemptVersion(ctx context.Context, tr readVersionSetter, maxAge time.Duration) (attemptAt, error) {
	at, err := d.readVersion(ctx, maxAge)
	if err == nil {
		tr.SetReadVersion(at.v)
	}
	return at, err
}

// readVersion is the read version of an attempt: the newest known one if
// it was the latest at most maxAge ago (a storage.Recent View's or an
// Update's first attempt; 0 for none), else a shared fresh one.
func (d *DB) readVersion(ctx context.Context, maxAge time.Duration) (attemptAt, error) {
	if maxAge > 0 {
		if v, ok := d.latest.recent(d.now(), maxAge); ok {
			return attemptAt{v: v, reused: true}, nil
		}
	}
	v, err := d.sharedReadVersion(ctx)
	if err != nil {
		return attemptAt{}, err
	}
	return attemptAt{v: v}, nil
}

// readVersionSetter is the part of a transaction attemptVersion needs.
type readVersionSetter interface {
	SetReadVersion(v int64)
}

// sharedReadVersion joins the next read version request and waits for its
// answer, or for ctx or Close.
func (d *DB) sharedReadVersion(ctx context.Context) (int64, error) {
	s := &d.sharing
	s.mu.Lock()
	if s.next == nil {
		s.next = &versionBatch{done: make(chan struct{})}
	}
	b := s.next
	if !s.sending {
		s.sending, s.next = true, nil
		s.fetchers.Add(1)
		go d.fetchVersions(b)
	}
	s.mu.Unlock()
	select {
	case <-b.done:
		return b.v, b.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-d.abort.Done():
		return 0, storage.ErrClosed
	}
}

// fetchVersions answers b, then each batch that formed meanwhile, until
// none did. Close cancels the request in flight.
func (d *DB) fetchVersions(b *versionBatch) {
	s := &d.sharing
	defer s.fetchers.Done()
	for b != nil {
		b.v, b.err = d.fetchVersion()
		close(b.done)
		s.mu.Lock()
		b, s.next = s.next, nil
		s.sending = b != nil
		s.mu.Unlock()
	}
}

// fetchVersion gets one read version, timing it and watching for
// recoveries.
func (d *DB) fetchVersion() (int64, error) {
	tr, err := d.txs.take(d.db)
	if err != nil {
		return 0, mapError(err)
	}
	defer d.txs.cancelOn(tr, context.Background(), d.abort)()
	start := d.now()
	rv, err := tr.GetReadVersion().Get()
	if err != nil {
		return 0, mapError(err)
	}
	now := d.now()
	d.latest.saw(rv, start)
	o := d.observe()
	o.ObserveFDBReadVersion(now.Sub(start))
	if d.versions.recovered(rv, now) {
		o.ObserveFDBRecovery()
	}
	return rv, nil
}
