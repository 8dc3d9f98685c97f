package owner

import (
	"bytes"
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// tick renews this replica's ownership, takes over a vacant or lapsed one,
// or else records what it saw, in one transaction.
func (e *Elector) tick() {
	start := e.clock.Now()
	e.mu.Lock()
	seen, held := e.seen, e.held
	lapsed := seen != nil && start.Sub(e.seenAt) >= e.cfg.TTL
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.TTL)
	defer cancel()
	var got, wrote []byte
	err := e.update(ctx, func(tx storage.Tx) error {
		cur, err := tx.Get(key)
		if err != nil {
			return err
		}
		// After commit_unknown_result the retry finds what an earlier
		// attempt of this tick wrote: that attempt landed.
		if wrote != nil && bytes.Equal(cur, wrote) {
			got = cur
			return nil
		}
		next, take := e.decide(cur, held, lapsed && bytes.Equal(cur, seen))
		if !take {
			got = cur
			return nil
		}
		got = next.encode()
		wrote = got
		tx.Set(key, got)
		return nil
	})
	if err != nil {
		if e.ctx.Err() == nil {
			e.lg.Warn("ownership renewal failed", zap.Error(err))
		}
		return
	}
	e.observe(got, start, e.clock.Now())
}

// decide returns the record to write, if this replica should: renew its
// own epoch, or take over a vacant record or one that stood still for TTL
// (lapsed).
func (e *Elector) decide(cur []byte, held uint64, lapsed bool) (record, bool) {
	r, err := decode(cur)
	if err != nil {
		// Unreadable (written by a newer version?): treat it as another
		// owner's, alive while it changes.
		e.lg.Warn("unreadable ownership record", zap.Error(err))
		r = record{ID: unreadable}
	}
	next := record{ID: e.id, Epoch: r.Epoch + 1, Beat: r.Beat + 1, URL: e.cfg.URL}
	switch {
	case r.ID == e.id && r.Epoch == held:
		next.Epoch = r.Epoch
		return next, true
	case r.ID == 0, lapsed:
		return next, true
	}
	return record{}, false
}

// observe records the outcome of a tick that started at start and ended
// at now, and wakes Changed's waiters if the owner or this replica's epoch
// changed.
func (e *Elector) observe(got []byte, start, now time.Time) {
	rec, err := decode(got)
	if err != nil {
		rec = record{ID: unreadable}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !bytes.Equal(got, e.seen) {
		e.seen, e.seenAt = got, now
	}
	var held uint64
	if rec.ID == e.id {
		held, e.renewed = rec.Epoch, start
	}
	if held == e.held && rec.ID == e.rec.ID && rec.Epoch == e.rec.Epoch {
		e.rec = rec
		return
	}
	e.lg.Info("owner", zap.Uint64("owner", rec.ID), zap.Uint64("epoch", rec.Epoch),
		zap.String("url", rec.URL), zap.Bool("self", held != 0))
	e.rec, e.held = rec, held
	close(e.changed)
	e.changed = make(chan struct{})
}

// release marks the record vacant if this replica still owns it, keeping
// the epoch so that the next owner's is higher.
func (e *Elector) release() {
	e.mu.Lock()
	held := e.held
	e.held = 0
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	if held == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.TTL)
	defer cancel()
	err := e.db.Update(ctx, func(tx storage.Tx) error {
		v, err := tx.Get(key)
		if err != nil {
			return err
		}
		r, err := decode(v)
		if err != nil || r.ID != e.id || r.Epoch != held {
			return nil // not ours any more
		}
		tx.Set(key, record{Epoch: held, Beat: r.Beat + 1}.encode())
		return nil
	})
	if err != nil && !errors.Is(err, storage.ErrClosed) {
		e.lg.Warn("releasing ownership", zap.Error(err))
	}
}
