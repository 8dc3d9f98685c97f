package owner

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// tick renews this replica's ownership, takes over a vacant or lapsed one,
// or else records what it saw, in one transaction. An owner whose process
// beats for it (Process) has nothing to write: it reads its record only
// when a beat found a deposal mark or verifyEvery intervals have passed.
func (e *Elector) tick() {
	start := e.clock.Now()
	gen, due := e.due(start)
	if !due {
		return
	}
	e.mu.Lock()
	seen, held, rec := e.seen, e.held, e.rec
	lapsed := seen != nil && start.Sub(e.seenAt) >= e.cfg.TTL
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.TTL)
	defer cancel()
	a := &tickAttempt{e: e, held: held, lapsed: lapsed, seen: seen}
	if err := e.update(ctx, e.outerKeys(rec), a.run); err != nil {
		if e.ctx.Err() == nil {
			e.lg.Warn("ownership renewal failed", zap.Error(err))
		}
		return
	}
	e.observe(a.got, a.live, a.wrote != nil && bytes.Equal(a.got, a.wrote), gen, start, e.clock.Now())
}

// due says whether a tick at start has a transaction to run, and gives
// the process's deposal generation before it (0 without a Process). An
// owner whose process beats for it has none while no beat has found a
// deposal mark since it last read its record and that read is under
// verifyEvery intervals old.
func (e *Elector) due(start time.Time) (gen uint64, due bool) {
	if e.proc == nil {
		return 0, true
	}
	e.mu.Lock()
	beaten := e.held != 0 && start.Sub(e.verifiedAt) < verifyEvery*e.cfg.RenewInterval
	verified := e.verifiedGen
	e.mu.Unlock()
	_, gen = e.proc.renewal()
	return gen, !beaten || gen != verified
}

// tickAttempt is a tick's transaction: what it knew before (held, lapsed,
// seen) and what its attempts found (got, live) and wrote.
type tickAttempt struct {
	e      *Elector
	held   uint64
	lapsed bool
	seen   []byte

	got, live []byte
	wrote     []byte // what an attempt wrote, kept across retries
}

func (a *tickAttempt) run(tx, outer storage.Tx) error {
	e := a.e
	cur, err := tx.Get(key)
	if err != nil {
		return err
	}
	// After commit_unknown_result the retry finds what an earlier attempt
	// of this tick wrote: that attempt landed.
	if a.wrote != nil && bytes.Equal(cur, a.wrote) {
		a.got, a.live = cur, nil
		return nil
	}
	r, err := decode(cur)
	if err != nil {
		// Unreadable (written by a newer version?): treat it as another
		// owner's, alive while it changes.
		e.lg.Warn("unreadable ownership record", zap.Error(err))
		r = record{ID: unreadable}
	}
	if a.live, err = processBeat(r, e.id, outer); err != nil {
		return err
	}
	next, take := e.decide(r, a.held, a.lapsed && bytes.Equal(observed(cur, a.live), a.seen))
	if !take {
		a.got = cur
		return nil
	}
	a.got = next.encode()
	a.wrote = a.got
	tx.Set(key, a.got)
	if r.Process && r.ID != 0 && r.ID != e.id && outer != nil {
		// Taken from a live-looking process's keyspaces: its next beat
		// learns of it (Process).
		outer.Set(keyspace.ProcessDeposed(r.ID), deposalMark())
	}
	return nil
}

// outerKeys are the shared store's keys a tick reads first: the beat of
// the process the record named at the last read, if it names one.
func (e *Elector) outerKeys(r record) [][]byte {
	if !r.Process || r.ID == 0 || r.ID == e.id {
		return nil
	}
	return [][]byte{keyspace.ProcessBeat(r.ID)}
}

// processBeat reads the beat of the process that r names as its owner's
// liveness, unless that is this replica's own process; nil without one.
func processBeat(r record, self uint64, outer storage.Tx) ([]byte, error) {
	if !r.Process || r.ID == 0 || r.ID == self || outer == nil {
		return nil, nil
	}
	return outer.Get(keyspace.ProcessBeat(r.ID))
}

// observed is what an observer compares from one read to the next: the
// record and, when its owner's liveness is its process's beat, that beat.
func observed(cur, live []byte) []byte {
	if live == nil {
		return cur
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(cur)))
	out = append(out, cur...)
	return append(out, live...)
}

// decide returns the record to write, if this replica should: renew its
// own epoch (unless its process's beats renew it), or take over a vacant
// record or one that stood still for TTL (lapsed), or one its own process
// holds under another epoch (an earlier elector of this process on this
// keyspace, stopped without handing it back).
func (e *Elector) decide(r record, held uint64, lapsed bool) (record, bool) {
	next := record{ID: e.id, Epoch: r.Epoch + 1, Beat: r.Beat + 1, URL: e.cfg.URL, Process: e.proc != nil}
	switch {
	case r.ID == e.id && r.Epoch == held:
		if next.Process && r.Process && r.URL == e.cfg.URL {
			return record{}, false
		}
		next.Epoch = r.Epoch
		return next, true
	case r.ID == 0, lapsed, e.proc != nil && r.ID == e.id:
		return next, true
	}
	return record{}, false
}

// observe records the outcome of a tick that started at start and ended
// at now: got is the record read or written (wrote says which), live its
// owner's process beat, gen the deposal generation before the tick. It
// wakes Changed's waiters if the owner or this replica's epoch changed.
func (e *Elector) observe(got, live []byte, wrote bool, gen uint64, start, now time.Time) {
	rec, err := decode(got)
	if err != nil {
		rec = record{ID: unreadable}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if obs := observed(got, live); !bytes.Equal(obs, e.seen) {
		e.seen, e.seenAt = obs, now
	}
	var held uint64
	if rec.ID == e.id {
		held, e.verifiedGen, e.verifiedAt = rec.Epoch, gen, start
		// A record that stands still renews nothing by being read; its
		// process's beats renew it (View).
		if wrote || !rec.Process {
			e.renewed = start
		}
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
