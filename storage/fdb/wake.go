//go:build fdb

package fdb

import (
	"context"
	"fmt"
	"sync"
	"time"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// wakeRegistry is a DB's WaitChange calls by key. A commit made through
// the DB wakes the calls on the keys it wrote as soon as it is known to
// have committed, before Update returns, instead of when FoundationDB's
// watch fires: a watch fires only once a storage server has applied the
// commit, about 15 ms later on a single memory fdbserver, and the watch
// hub of a write owner waits on the head key every one of its commits
// writes. Commits of other processes (and of other DB handles) still
// arrive by the watch, which every WaitChange keeps setting.
type wakeRegistry struct {
	mu      sync.Mutex
	waiting map[string]*keyWake // guarded by mu; by FoundationDB key
}

// keyWake is the WaitChange calls on one key: ch is closed, and the entry
// removed, by the first commit through the DB that writes the key.
type keyWake struct {
	ch chan struct{}
	n  int // guarded by wakeRegistry.mu: calls holding ch
}

// woken reports whether a commit closed w.ch.
func (w *keyWake) woken() bool {
	select {
	case <-w.ch:
		return true
	default:
		return false
	}
}

// add registers a WaitChange call on FoundationDB key fkey. The call
// registers before it reads the key, so that a commit after that read
// wakes it.
func (r *wakeRegistry) add(fkey []byte) *keyWake {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = map[string]*keyWake{}
	}
	w := r.waiting[string(fkey)]
	if w == nil {
		w = &keyWake{ch: make(chan struct{})}
		r.waiting[string(fkey)] = w
	}
	w.n++
	return w
}

// drop unregisters one call on fkey; the last one removes the entry,
// unless a commit already did.
func (r *wakeRegistry) drop(fkey []byte, w *keyWake) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.n--; w.n == 0 && r.waiting[string(fkey)] == w {
		delete(r.waiting, string(fkey))
	}
}

// wake wakes the calls on the keys the logs wrote.
func (r *wakeRegistry) wake(logs ...*writeLog) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waiting) == 0 {
		return
	}
	for _, l := range logs {
		for _, k := range l.keys {
			if w, ok := r.waiting[string(k)]; ok {
				close(w.ch)
				delete(r.waiting, string(k))
			}
		}
		for _, c := range l.clears {
			for k, w := range r.waiting {
				if k >= string(c[0]) && k < string(c[1]) {
					close(w.ch)
					delete(r.waiting, k)
				}
			}
		}
	}
}

// writeLog is the FoundationDB keys one transaction attempt wrote (set or
// cleared) and the ranges it cleared, for wakeRegistry.wake. The slices
// are the ones handed to FoundationDB, which copies them, so logging costs
// no copy.
type writeLog struct {
	keys   [][]byte
	clears [][2][]byte
}

func (l *writeLog) key(fkey []byte)         { l.keys = append(l.keys, fkey) }
func (l *writeLog) clear(begin, end []byte) { l.clears = append(l.clears, [2][]byte{begin, end}) }
func (l *writeLog) empty() bool             { return len(l.keys) == 0 && len(l.clears) == 0 }

// merge adds o's writes to l: an attempt whose commit may have landed
// (commit_unknown_result) wakes nobody until a later attempt of the same
// Update commits and so settles it.
func (l *writeLog) merge(o *writeLog) {
	l.keys = append(l.keys, o.keys...)
	l.clears = append(l.clears, o.clears...)
}

// WaitChange returns once the value at key differs from seen: woken by a
// commit of this DB that wrote key, or by a FoundationDB watch.
func (d *DB) WaitChange(ctx context.Context, key, seen []byte) error {
	if err := d.enter(ctx); err != nil {
		return err
	}
	defer d.leave()
	fkey := fdbgo.Key(d.key(key))
	if len(key) > maxKeySize {
		// No such key can exist: its value is absent, forever.
		if seen != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.closing.Done():
			return storage.ErrClosed
		}
	}
	w := d.wakes.add(fkey)
	defer d.wakes.drop(fkey, w)
	err := d.watch(ctx, fkey, seen, w)
	if err != nil && w.woken() {
		// A commit of this DB wrote the key before Update returned: its
		// waiter sees it even when its context ends right after.
		return nil
	}
	return err
}

// watch waits for a change of fkey from seen through FoundationDB watches,
// retried as Update's attempts are, or until w is woken.
func (d *DB) watch(ctx context.Context, fkey fdbgo.Key, seen []byte, w *keyWake) error {
	tr, err := d.db.CreateTransaction()
	if err != nil {
		return mapError(err)
	}
	defer context.AfterFunc(ctx, tr.Cancel)()
	defer context.AfterFunc(d.closing, tr.Cancel)()
	for retries := 0; ; {
		err := d.watchOnce(ctx, tr, fkey, seen, w)
		if err == nil {
			return nil
		}
		code, ok := retryCode(err)
		if !ok {
			return err // ctx's error, or ErrClosed
		}
		if stop := stopped(ctx, d.closing); stop != nil {
			return stop
		}
		if code == codeTooManyWatches {
			// Every watch the client allows is in use. Not a failure of
			// the cluster, so no retry is spent: read the key again a
			// poll interval later, and ask for a watch again then.
			d.observe().ObserveFDBRetry(code, mapError(err))
			if err := d.pollWait(ctx, w); err != nil {
				return err
			}
			tr.Reset()
			continue
		}
		if retries >= d.maxRetries {
			return fmt.Errorf("storage/fdb: giving up after %d retries: %w", retries, mapError(err))
		}
		retries++
		// OnError resets the transaction (also after a committed watch) and
		// backs off; it refuses errors that are not worth retrying.
		if oerr := tr.OnError(fdbgo.Error{Code: code}).Get(); oerr != nil {
			if stop := stopped(ctx, d.closing); stop != nil {
				return stop
			}
			return mapError(err)
		}
	}
}

// pollWait waits a poll interval, or less when w is woken (watchOnce then
// returns at once); it fails only when ctx or the DB ends.
func (d *DB) pollWait(ctx context.Context, w *keyWake) error {
	t := time.NewTimer(d.watchPoll)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.ch:
	case <-ctx.Done():
	case <-d.closing.Done():
	}
	return stopped(ctx, d.closing)
}

// watchOnce reads key; if it still holds seen, it watches it and waits for
// the watch or for w.
func (d *DB) watchOnce(ctx context.Context, tr fdbgo.Transaction, key fdbgo.Key, seen []byte, w *keyWake) error {
	if w.woken() {
		return nil
	}
	v, err := tr.Get(key).Get()
	if err != nil {
		return mapError(err)
	}
	if !storage.SameValue(v, seen) {
		return nil
	}
	// The watch fires when the value differs from the one this transaction
	// read, even if it changed between the read and the commit.
	fw := tr.Watch(key)
	if err := tr.Commit().Get(); err != nil {
		fw.Cancel()
		return mapError(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.Get() }()
	select {
	case err := <-done:
		return mapError(err)
	case <-w.ch:
		fw.Cancel()
		<-done
		return nil
	case <-ctx.Done():
		fw.Cancel()
		<-done
		return ctx.Err()
	case <-d.closing.Done():
		fw.Cancel()
		<-done
		return storage.ErrClosed
	}
}
