package lease

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

var errRenewed = errors.New("lease: renewed since it was found expired")

// run is the lessor's one background loop: while this process owns expiry
// (package owner decides) it promotes the leases once per epoch and expires
// due ones. It sleeps on the clock between wakes: the next deadline in the
// index window, the next window read, or a change of ownership.
func (l *Lessor) run() {
	defer l.wg.Done()
	defer l.endWake()
	retry := expiryRetry{}
	for !l.stopped() {
		changed := l.owner.Changed()
		st := l.adopt()
		wake := wakePlan{at: l.clock.Now().Add(l.cfg.ScanInterval)}
		if st.owned && !st.promoted {
			if done, err := l.promotePage(st); err == nil && !done {
				continue
			} else if err != nil {
				l.lg.Warn("lease promotion failed; retrying", zap.Error(err))
			}
			st = l.state()
		}
		if !st.owned {
			clear(retry) // another owner tries them now
		}
		if st.owned && st.promoted {
			next, more := l.expirePass(st, retry)
			if more {
				continue
			}
			wake = next
		}
		l.sleep(wake, changed)
	}
}

// wakePlan is when the run loop wakes next: at at, or, when watch is set,
// as soon as the wake key differs from seen.
type wakePlan struct {
	at    time.Time
	watch bool
	seen  []byte
}

// sleep waits for p, a change of ownership or Stop. The wake key is waited
// for by a wakeWait, which stays running when the sleep ends for another
// reason and serves the next quiet sleep if the key still holds the value
// it waits on; any other sleep ends it. A change of the key does not end
// the sleep at once: the lease that changed it is due MinTTL after its
// grant at the earliest, at least ScanInterval away, so the loop sleeps
// ScanInterval more, and reads the index at most once per ScanInterval
// however often leases are granted. A wait that fails (FoundationDB's
// limit on watches, say) does the same, so the index is then read every
// ScanInterval, as if no deadline were far.
func (l *Lessor) sleep(p wakePlan, changed <-chan struct{}) {
	if !p.watch {
		l.endWake()
		l.clock.Sleep(p.at.Sub(l.clock.Now()), l.stop, changed)
		return
	}
	if l.wake != nil && !l.wake.waits(p.seen) {
		l.endWake()
	}
	if l.wake == nil {
		// l.ctx ends right after l.stop closes, so the wait's end covers Stop.
		l.wake = startWakeWait(l.ctx, l.db, p.seen)
	}
	w := l.wake
	l.clock.Sleep(p.at.Sub(l.clock.Now()), changed, w.done)
	if !w.ended() || l.ctx.Err() != nil {
		return // the time, ownership or Stop ended the sleep
	}
	l.wake = nil
	if w.err != nil {
		log := l.lg.Debug
		if !l.watchFailed {
			log, l.watchFailed = l.lg.Warn, true
		}
		log("waiting for new lease deadlines; reading them every scan interval instead", zap.Error(w.err))
	}
	l.clock.Sleep(min(p.at.Sub(l.clock.Now()), l.cfg.ScanInterval), l.stop, changed)
}

// endWake stops the run loop's wait for the wake key, if any.
func (l *Lessor) endWake() {
	if l.wake != nil {
		l.wake.stop()
		l.wake = nil
	}
}

func (l *Lessor) state() ownState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.own
}

// adopt takes the elector's view. A new epoch starts unpromoted; an epoch
// held again after its renewals lapsed for a while keeps its promotion,
// which must happen once per epoch (leases granted since carry no stamp).
func (l *Lessor) adopt() ownState {
	v := l.owner.View()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !v.Held && l.own.owned:
		l.lg.Info("lease expiry ownership lost", zap.Uint64("epoch", l.own.epoch))
		l.cfg.Observer.SetLeaseOwner(false)
		l.own.owned = false
	case v.Held && !l.own.owned:
		l.lg.Info("lease expiry ownership acquired", zap.Uint64("epoch", v.Epoch))
		l.cfg.Observer.SetLeaseOwner(true)
		if l.own.epoch != v.Epoch {
			l.own = ownState{epoch: v.Epoch}
		}
		l.own.owned = true
	case v.Held && l.own.epoch != v.Epoch:
		l.own = ownState{owned: true, epoch: v.Epoch}
	}
	return l.own
}

// holds reports whether this process still owns expiry in epoch.
func (l *Lessor) holds(epoch uint64) bool {
	v := l.owner.View()
	return v.Held && v.Epoch == epoch
}

// promotePage extends one page of leases by Extend, as etcd's Promote does
// for all of them; done reports that every lease has been extended in this
// epoch. A lease's epoch stamp makes a retried page extend nothing twice.
func (l *Lessor) promotePage(st ownState) (done bool, err error) {
	begin, end := keyspace.LeaseAll()
	if st.cursor != nil {
		begin = st.cursor
	}
	var next []byte
	var extended int
	err = l.db.Update(l.ctx, func(tx storage.Tx) error {
		next, extended = nil, 0
		now := l.clock.Now().UnixMicro()
		if err := l.owner.Fence(tx, st.epoch); err != nil {
			return err
		}
		kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: l.cfg.PromotePage})
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			id, err := keyspace.ParseLease(kv.Key)
			if err != nil {
				return err
			}
			rec, err := decodeRecord(kv.Value)
			if err != nil {
				l.lg.Warn("skipping corrupt lease record", zap.Int64("lease", id), zap.Error(err))
				continue
			}
			if rec.Epoch >= st.epoch {
				continue
			}
			old := rec.Deadline
			rec.Deadline = addSat(max(old, now), l.cfg.Extend)
			rec.Epoch = st.epoch
			setDeadline(tx, id, rec, old)
			extended++
		}
		if len(kvs) == l.cfg.PromotePage {
			next = append(kvs[len(kvs)-1].Key, 0)
		}
		return nil
	})
	if errors.Is(err, owner.ErrNotOwner) {
		return false, nil // the next adopt sees the new owner
	}
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.own.owned || l.own.epoch != st.epoch {
		return false, nil
	}
	l.own.cursor = next
	if next == nil {
		l.own.promoted = true
		l.lg.Info("lease expiry ownership promoted: leases extended", zap.Uint64("epoch", st.epoch), zap.Duration("extend", l.cfg.Extend))
	}
	return next == nil, nil
}

type indexEntry struct {
	deadline int64
	id       int64
}

type outcome int

const (
	outExpired  outcome = iota // revoked, or already gone
	outRenewed                 // not due any more
	outNotOwner                // fenced off: another lessor owns expiry
	outFailed                  // storage failure; try again later
)

// expiryRetry holds the leases whose revoke failed, and when each may be
// tried again: the delay doubles from minExpiryRetry to maxExpiryRetry, so
// that a lease that keeps failing (its revoke timing out, the storage
// refusing it) is tried less and less often instead of on every pass,
// ahead of the leases behind it. The run loop owns it; an entry goes when
// its lease expires or turns out renewed, so it holds only failing leases.
type expiryRetry map[int64]retryState

type retryState struct {
	at    time.Time
	delay time.Duration
}

const (
	minExpiryRetry = time.Second
	maxExpiryRetry = time.Minute
)

func (r expiryRetry) failed(id int64, now time.Time) time.Time {
	d := minExpiryRetry
	if s, ok := r[id]; ok {
		d = min(2*s.delay, maxExpiryRetry)
	}
	r[id] = retryState{at: now.Add(d), delay: d}
	return now.Add(d)
}

// waiting returns when lease id may be tried again, and whether that is
// still to come.
func (r expiryRetry) waiting(id int64, now time.Time) (time.Time, bool) {
	s, ok := r[id]
	return s.at, ok && now.Before(s.at)
}

// expirePass expires the due leases at the start of the index, skipping
// those waiting to be retried, and returns when to wake next; more means
// there may be more due leases and the caller should go again at once.
func (l *Lessor) expirePass(st ownState, retry expiryRetry) (next wakePlan, more bool) {
	now := l.clock.Now()
	due, next, full, err := l.dueLeases(now, retry)
	if err != nil {
		if l.ctx.Err() == nil {
			l.lg.Warn("reading lease deadlines", zap.Error(err))
		}
		return wakePlan{at: now.Add(l.cfg.ScanInterval)}, false
	}
	stale, lost := l.expireDue(st, due, now, retry)
	l.clearStale(stale)
	for _, e := range due {
		if at, wait := retry.waiting(e.id, now); wait && at.Before(next.at) {
			next.at = at
		}
	}
	// The leases that failed wait now, so the next pass gets past them.
	return next, !lost && full
}

// dueLeases reads the deadline index from its start, in pages of
// ExpireBatch, skipping leases waiting to be retried, until it has
// ExpireBatch due leases (full) or reaches the first lease not yet due. next
// is the earliest time another lease becomes due or may be retried, within
// ScanInterval; with none that close, the earliest deadline beyond, within
// QuietScanInterval, or a new deadline written since the first page's
// snapshot (the wake key).
func (l *Lessor) dueLeases(now time.Time, retry expiryRetry) (due []indexEntry, next wakePlan, full bool, err error) {
	nowN := now.UnixMicro()
	next = wakePlan{at: now.Add(l.cfg.ScanInterval)}
	end := indexUpTo(next.at.UnixMicro())
	quiet, err := l.readQuiet(end)
	if err != nil {
		return nil, next, false, err
	}
	retrying := false
	for kvs := quiet.window; ; {
		for _, kv := range kvs {
			d, id, err := parseIndex(kv.Key)
			if err != nil {
				return nil, next, false, err
			}
			if d > nowN {
				next.at = minTime(next.at, time.UnixMicro(d))
				return due, next, false, nil
			}
			if at, wait := retry.waiting(id, now); wait {
				next.at, retrying = minTime(next.at, at), true
				continue
			}
			if due = append(due, indexEntry{d, id}); len(due) == l.cfg.ExpireBatch {
				return due, next, true, nil
			}
		}
		if len(kvs) < l.cfg.ExpireBatch {
			if len(due) == 0 && !retrying {
				// Nothing due, retried or near: sleep until the earliest
				// deadline or a new one.
				next = quiet.plan(now, l.cfg.QuietScanInterval, l.cfg.ScanInterval)
			}
			return due, next, false, nil
		}
		from := append(kvs[len(kvs)-1].Key, 0)
		err := l.db.View(l.ctx, func(tx storage.ReadTx) error {
			var err error
			kvs, err = tx.GetRange(from, end, storage.RangeOptions{Limit: l.cfg.ExpireBatch})
			return err
		})
		if err != nil {
			return nil, next, false, err
		}
	}
}

// quietRead is the first page of the index window read with what a quiet
// sleep needs from the same snapshot.
type quietRead struct {
	window   []storage.KeyValue // the window's first page
	seen     []byte             // the wake key
	earliest int64              // the first deadline past the window; -1 for none
}

// readQuiet reads the window's first page, the wake key and the first
// deadline past the window in one snapshot (one round trip).
func (l *Lessor) readQuiet(end []byte) (quietRead, error) {
	var q quietRead
	err := l.db.View(l.ctx, func(tx storage.ReadTx) error {
		vals, ranges, err := storage.ReadBatch(tx, [][]byte{wakeKey}, []storage.RangeRead{
			{Begin: indexPrefix, End: end, Opt: storage.RangeOptions{Limit: l.cfg.ExpireBatch}},
			{Begin: end, End: indexEnd, Opt: storage.RangeOptions{Limit: 1}},
		})
		if err != nil {
			return err
		}
		q = quietRead{window: ranges[0], seen: vals[0], earliest: -1}
		if len(ranges[1]) == 1 {
			d, _, err := parseIndex(ranges[1][0].Key)
			if err != nil {
				return err
			}
			q.earliest = d
		}
		return nil
	})
	return q, err
}

// plan is the quiet sleep: until the earliest deadline, at most max, and
// woken by a change of the wake key. The bound is rounded down to a whole
// multiple of align (ScanInterval) on the clock, the same instant for
// every tenant of the process (and for each tenant's elector, which ticks
// on whole RenewIntervals): the quiet reads of a process's tenants then
// start together and share read versions, one request a round instead of
// one per tenant. It stays after now, as max is at least align, and
// deadlines are not rounded, so no lease expires later.
func (q quietRead) plan(now time.Time, max, align time.Duration) wakePlan {
	at := now.Add(max).Truncate(align)
	if q.earliest >= 0 {
		at = minTime(at, time.UnixMicro(q.earliest))
	}
	return wakePlan{at: at, watch: true, seen: q.seen}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// expireDue revokes the due leases, ExpireConcurrency at a time. It returns
// longer describe a lease, and whether ownership was lost; the leases that
// failed are scheduled for retry.
func (l *Lessor) expireDue(st ownState, due []indexEntry, now time.Time, retry expiryRetry) (stale []indexEntry, lost bool) {
	nowN := now.UnixMicro()
	for start := 0; start < len(due) && !lost; start += l.cfg.ExpireConcurrency {
		chunk := due[start:min(start+l.cfg.ExpireConcurrency, len(due))]
		outs := make([]outcome, len(chunk))
		var wg sync.WaitGroup
		for i, e := range chunk {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i] = l.expire(st.epoch, e.id, nowN)
			}()
		}
		wg.Wait()
		for i, o := range outs {
			switch o {
			case outExpired, outRenewed:
				stale = append(stale, chunk[i])
				delete(retry, chunk[i].id)
			case outNotOwner:
				lost = true
			case outFailed:
				retry.failed(chunk[i].id, l.clock.Now())
			}
		}
		// A pass that outlives the epoch stops; the new owner goes on.
		lost = lost || !l.holds(st.epoch)
	}
	return stale, lost
}

// expire revokes lease id if it is still due at nowN and this lessor still
// owns expiry in epoch, both checked inside the revoke's transaction.
func (l *Lessor) expire(epoch uint64, id int64, nowN int64) outcome {
	fence := func(tx storage.ReadTx) error {
		if err := l.owner.Fence(tx, epoch); err != nil {
			if errors.Is(err, owner.ErrNotOwner) {
				return &mvcc.FenceError{Err: err}
			}
			return err
		}
		v, err := tx.Get(keyspace.Lease(id))
		if err != nil || v == nil {
			return err // gone: the revoke reports it not found
		}
		rec, err := decodeRecord(v)
		if err != nil {
			return &mvcc.FenceError{Err: err}
		}
		if rec.Deadline > nowN {
			return &mvcc.FenceError{Err: errRenewed}
		}
		return nil
	}
	resp, err := l.store.Revoke(l.ctx, &mvcc.RevokeRequest{ID: id, Fence: fence})
	switch {
	case err == nil:
		l.lg.Debug("lease expired", zap.Int64("lease", id), zap.Int64("revision", resp.Header.Revision))
		l.cfg.Observer.LeaseExpired(1)
		l.cfg.Observer.LeaseRevoked()
		return outExpired
	case errors.Is(err, mvcc.ErrLeaseNotFound):
		return outExpired
	case errors.Is(err, owner.ErrNotOwner):
		return outNotOwner
	case errors.Is(err, errRenewed):
		return outRenewed
	}
	if l.ctx.Err() == nil {
		l.lg.Warn("expiring lease", zap.Int64("lease", id), zap.Error(err))
	}
	return outFailed
}

// clearStale removes index entries that no longer describe a record: the
// lease is gone (revoked or expired) or has another deadline now.
func (l *Lessor) clearStale(es []indexEntry) {
	if len(es) == 0 {
		return
	}
	err := l.db.Update(l.ctx, func(tx storage.Tx) error {
		keys := make([][]byte, len(es))
		for i, e := range es {
			keys[i] = keyspace.Lease(e.id)
		}
		vals, err := tx.GetMany(keys)
		if err != nil {
			return err
		}
		for i, e := range es {
			if vals[i] != nil {
				if rec, err := decodeRecord(vals[i]); err == nil && rec.Deadline == e.deadline {
					continue
				}
			}
			tx.Clear(indexKey(e.deadline, e.id))
		}
		return nil
	})
	if err != nil && l.ctx.Err() == nil {
		l.lg.Warn("clearing stale lease deadlines", zap.Error(err))
	}
}
