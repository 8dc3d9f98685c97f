package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

var (
	errNotOwner = errors.New("lease: this lessor no longer owns expiry")
	errRenewed  = errors.New("lease: renewed since it was found expired")
)

// run is the lessor's one background loop: it holds or seeks ownership,
// promotes after taking over, and expires due leases. It sleeps on the clock
// between wakes: the next ownership renewal, the next deadline in the index
// window, or the next window read.
func (l *Lessor) run() {
	defer l.wg.Done()
	var nextRenew time.Time
	for !l.stopped() {
		now := l.clock.Now()
		if !now.Before(nextRenew) {
			l.renewOwnership(now)
			nextRenew = now.Add(l.cfg.RenewInterval)
		}
		wake := nextRenew
		st := l.state()
		if st.owned && !st.promoted {
			if done, err := l.promotePage(st); err == nil && !done {
				continue
			} else if err != nil {
				l.lg.Warn("lease promotion failed; retrying", zap.Error(err))
			}
			st = l.state()
		}
		if st.owned && st.promoted {
			next, more := l.expirePass(st, &nextRenew)
			if more {
				continue
			}
			if next.Before(wake) {
				wake = next
			}
		}
		select {
		case <-l.clock.After(wake.Sub(l.clock.Now())):
		case <-l.stop:
		}
	}
	l.release()
}

func (l *Lessor) state() ownState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.own
}

func (l *Lessor) lose(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.own.owned {
		l.lg.Info("lease expiry ownership lost", zap.Uint64("epoch", l.own.epoch), zap.String("reason", why))
		l.cfg.Observer.SetLeaseOwner(false)
	}
	l.own = ownState{}
}

// renewOwnership renews this lessor's ownership, or takes it over when the
// recorded owner's time has run out.
func (l *Lessor) renewOwnership(now time.Time) {
	nowN := now.UnixMicro()
	var o owner
	var mine bool
	err := l.db.Update(l.ctx, func(tx storage.Tx) error {
		cur, err := readOwner(tx)
		if err != nil {
			return err
		}
		switch {
		case cur.ID == l.cfg.ID && cur.Epoch != 0:
			o = owner{ID: l.cfg.ID, Epoch: cur.Epoch, Until: addSat(nowN, l.cfg.OwnerTTL)}
		case cur.Until < nowN:
			o = owner{ID: l.cfg.ID, Epoch: cur.Epoch + 1, Until: addSat(nowN, l.cfg.OwnerTTL)}
		default:
			o, mine = cur, false
			return nil
		}
		mine = true
		tx.Set(ownerKey, o.encode())
		return nil
	})
	if err != nil {
		if l.ctx.Err() == nil {
			l.lg.Warn("lease ownership renewal failed", zap.Error(err))
		}
		return
	}
	if !mine {
		l.lose("another lessor owns expiry")
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.own.owned || l.own.epoch != o.Epoch {
		l.lg.Info("lease expiry ownership acquired", zap.Uint64("epoch", o.Epoch), zap.Uint64("owner", o.ID))
		l.own = ownState{owned: true, epoch: o.Epoch}
		l.cfg.Observer.SetLeaseOwner(true)
	}
}

// release hands ownership back on Stop so that a successor need not wait
// for it to time out.
func (l *Lessor) release() {
	l.mu.Lock()
	st, skip := l.own, l.skipRelease
	l.own = ownState{}
	l.mu.Unlock()
	if !st.owned || skip {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := l.db.Update(ctx, func(tx storage.Tx) error {
		cur, err := readOwner(tx)
		if err != nil || cur.ID != l.cfg.ID || cur.Epoch != st.epoch {
			return err
		}
		cur.Until = 0
		tx.Set(ownerKey, cur.encode())
		return nil
	})
	if err != nil {
		l.lg.Warn("releasing lease expiry ownership", zap.Error(err))
	}
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
		o, err := readOwner(tx)
		if err != nil {
			return err
		}
		if o.ID != l.cfg.ID || o.Epoch != st.epoch {
			return errNotOwner
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
	if errors.Is(err, errNotOwner) {
		l.lose("superseded during promotion")
		return false, nil
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
func (l *Lessor) expirePass(st ownState, nextRenew *time.Time) (next time.Time, more bool) {
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
		// A long pass must not let ownership lapse.
		if t := l.clock.Now(); !lost && !t.Before(*nextRenew) {
			l.renewOwnership(t)
			*nextRenew = t.Add(l.cfg.RenewInterval)
			if s := l.state(); !s.owned || s.epoch != st.epoch {
				lost = true
			}
		}
	}
	if lost {
		l.lose("fenced off while expiring")
	}
	l.clearStale(stale)
	more = !lost && !failed && len(entries) == l.cfg.ExpireBatch && len(due) == len(entries)
	if failed {
		next = now.Add(min(l.cfg.ScanInterval, l.cfg.RenewInterval))
	}
	return next, more
}

// expire revokes lease id if it is still due at nowN and this lessor still
// owns expiry in epoch, both checked inside the revoke's transaction.
func (l *Lessor) expire(epoch uint64, id int64, nowN int64) outcome {
	fence := func(tx storage.ReadTx) error {
		o, err := readOwner(tx)
		if err != nil {
			return err
		}
		if o.ID != l.cfg.ID || o.Epoch != epoch {
			return &mvcc.FenceError{Err: errNotOwner}
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
	case errors.Is(err, errNotOwner):
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
