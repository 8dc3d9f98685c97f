//go:build fdb

package fdb

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"
)

// The Views of one read version share a transaction. Every call a
// transaction takes from its caller's thread — reset, set the read
// version, a read — is a task posted to the C client's one network
// thread, and at the rates a server sees that thread is asleep between
// tasks, so each one costs a wake-up on both sides. A plain client doing
// 4,800 one-key reads a second from 16 goroutines spent 114 µs of CPU per
// read with a reset transaction of its own per read and 66 µs with one
// transaction per read version (two shared cores, one memory fdbserver);
// closed-loop, where the thread never sleeps, 39 and 35 µs. Views only
// read, at a version they are given, so nothing of one View shows in
// another's reads once read-your-writes is off; what a shared transaction
// cannot do is end one View's reads when its request ends, so a View
// waits for its reads on the side and leaves them when its request or the
// DB ends (tx.await).

// maxShareAge bounds how long one transaction serves the Views of its
// version. Versions move with every commit and every read version request
// of a busy keyspace; on an idle one the same version can come back from
// the cluster for a while, and a transaction should not live on as long
// as the keyspace stays idle.
const maxShareAge = time.Second

// readShares holds the transaction of the newest read version Views use.
type readShares struct {
	mu  sync.Mutex
	cur *readShare // guarded by mu
	// waiters counts the goroutines waiting for reads of shared
	// transactions: Close waits for them before the network can stop.
	waiters sync.WaitGroup
}

// readShare is one shared transaction and the Views using it.
type readShare struct {
	v    int64
	tr   fdbgo.Transaction
	born time.Time
	// stopAbort stops the cancellation of tr when the DB aborts.
	stopAbort func() bool
	pool      *txPool // where tr goes once no View uses it
	users     int     // guarded by readShares.mu
	retired   bool    // guarded by readShares.mu: no View joins it any more
	// abandoned records that a View left while one of its reads was in
	// flight: tr is canceled once the last View leaves the retired share,
	// ending the goroutines that still wait for such reads.
	abandoned atomic.Bool
}

// usable reports whether a View of version v at now may join r.
func (r *readShare) usable(v int64, now time.Time) bool {
	return r != nil && r.v == v && now.Sub(r.born) < maxShareAge
}

// join returns the shared transaction of read version v, counting the
// caller as a user until it calls leave.
func (s *readShares) join(d *DB, v int64) (*readShare, error) {
	now := d.now()
	s.mu.Lock()
	if c := s.cur; c.usable(v, now) {
		c.users++
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	// Made outside the lock: each of these calls posts to the network
	// thread.
	tr, err := d.txs.take(d.db)
	if err != nil {
		return nil, mapError(err)
	}
	if err := tr.Options().SetReadYourWritesDisable(); err != nil {
		return nil, mapError(err)
	}
	tr.SetReadVersion(v)
	r := &readShare{v: v, tr: tr, born: now, users: 1, pool: &d.txs}
	r.stopAbort = context.AfterFunc(d.abort, tr.Cancel)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch c := s.cur; {
	case c.usable(v, now): // another View made one meanwhile
		c.users++
		if r.stopAbort() {
			d.txs.put(tr)
		}
		return c, nil
	case c != nil && c.v > v: // a newer version is in use: r serves its maker only
		r.retired = true
		return r, nil
	case c != nil:
		c.retired = true
		c.endIfIdle()
	}
	s.cur = r
	return r, nil
}

// leave ends the caller's use of r.
func (s *readShares) leave(r *readShare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.users--
	r.endIfIdle()
}

// endIfIdle lets r go once it is retired and unused, canceling it if a
// View left reads of it behind. Called with readShares.mu held.
func (r *readShare) endIfIdle() {
	if !r.retired || r.users > 0 {
		return
	}
	switch {
	case !r.stopAbort(): // canceled by the DB's abort
	case r.abandoned.Load():
		r.tr.Cancel()
	default:
		r.pool.put(r.tr)
	}
}

// await runs read, which waits for FoundationDB. On a transaction of the
// View's own it just runs it: the request's end cancels the transaction,
// which ends the wait. On a shared one it waits on a goroutine of its own
// and returns when read does, or when the request or the DB ends; then
// cancel (if not nil) cancels what read waits for, and otherwise the read
// stops at its next step (t.gone) or when its transaction is canceled.
func (t *tx) await(read func(), cancel func()) error {
	if t.share == nil {
		read()
		return nil
	}
	done := make(chan struct{})
	t.d.shares.waiters.Add(1)
	go func() {
		defer t.d.shares.waiters.Done()
		read()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-t.ctx.Done():
	case <-t.d.abort.Done():
	}
	t.gone.Store(true)
	t.share.abandoned.Store(true)
	if cancel != nil {
		cancel()
	}
	return stopped(t.ctx, t.d.abort)
}
