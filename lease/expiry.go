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
	for !l.stopped() {
		changed := l.owner.Changed()
		st := l.adopt()
		wake := l.clock.Now().Add(l.cfg.ScanInterval)
		if st.owned && !st.promoted {
			if done, err := l.promotePage(st); err == nil && !done {
				continue
			} else if err != nil {
				l.lg.Warn("lease promotion failed; retrying", zap.Error(err))
			}
			st = l.state()
		}
		if st.owned && st.promoted {
			next, more := l.expirePass(st)
			if more {
				continue
			}
			wake = next
		}
		l.clock.Sleep(wake.Sub(l.clock.Now()), l.stop, changed)
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

// expirePass reads the index window, expires what is due, and returns when
// to wake next; more means the window was full of due leases and the caller
// should go again at once.
func (l *Lessor) expirePass(st ownState) (next time.Time, more bool) {
	now := l.clock.Now()
	nowN := now.UnixMicro()
	horizon := now.Add(l.cfg.ScanInterval)
	var entries []indexEntry
	err := l.db.View(l.ctx, func(tx storage.ReadTx) error {
		entries = nil
		kvs, err := tx.GetRange(indexPrefix, indexUpTo(horizon.UnixMicro()), storage.RangeOptions{Limit: l.cfg.ExpireBatch})
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			d, id, err := parseIndex(kv.Key)
			if err != nil {
				return err
			}
			entries = append(entries, indexEntry{d, id})
		}
		return nil
	})
	if err != nil {
		if l.ctx.Err() == nil {
			l.lg.Warn("reading lease deadlines", zap.Error(err))
		}
		return horizon, false
	}
	next = horizon
	var due []indexEntry
	for _, e := range entries {
		if e.deadline > nowN {
			next = time.UnixMicro(e.deadline)
			break
		}
		due = append(due, e)
	}
	var stale []indexEntry
	failed, lost := false, false
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
			case outNotOwner:
				lost = true
			case outFailed:
				failed = true
			}
		}
		// A pass that outlives the epoch stops; the new owner goes on.
		lost = lost || !l.holds(st.epoch)
	}
	l.clearStale(stale)
	more = !lost && !failed && len(entries) == l.cfg.ExpireBatch && len(due) == len(entries)
	if failed || lost {
		// Try again a scan later; a change of owner wakes the loop sooner.
		next = horizon
	}
	return next, more
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
