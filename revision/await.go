package revision

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// awaitPending waits until the staged write recorded as rec is published,
// finishing it itself if its writer shows no progress for BeatTimeout, or
// until ctx ends. The wait does not count against any batch's
// CommitTimeout: nothing of the waiting batch has been written, and its
// requests queue as they would behind a long batch. A takeover, once
// started, runs to its end whatever ctx does: it is another writer's
// request, which every waiter needs published.
func (s *Sequencer[Resp]) awaitPending(ctx context.Context, rec []byte) error {
	pending, beat, err := s.readPending()
	if err != nil {
		return err
	}
	since := s.cfg.Now()
	for bytes.Equal(pending, rec) {
		if err := s.waitPendingChange(ctx, rec); err != nil {
			return err
		}
		var cur []byte
		pending, cur, err = s.readPending()
		if err != nil {
			return err
		}
		switch {
		case !bytes.Equal(pending, rec):
		case !bytes.Equal(cur, beat):
			beat, since = cur, s.cfg.Now()
		case s.cfg.Now().Sub(since) >= s.cfg.BeatTimeout:
			return s.rollForward(rec)
		}
	}
	return nil
}

// waitPendingChange blocks until Pending differs from rec, for at most
// half a beat timeout, or until Stop or the end of ctx.
func (s *Sequencer[Resp]) waitPendingChange(ctx context.Context, rec []byte) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.BeatTimeout/2)
	defer cancel()
	defer context.AfterFunc(s.stop, cancel)()
	err := s.db.WaitChange(wctx, keyspace.Pending, rec)
	switch {
	case s.stop.Err() != nil:
		return ErrStopped
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil || errors.Is(err, context.DeadlineExceeded):
		return nil
	}
	return err
}

func (s *Sequencer[Resp]) readPending() (pending, beat []byte, err error) {
	ctx, cancel := context.WithTimeout(s.stop, s.cfg.CommitTimeout)
	defer cancel()
	err = s.db.View(ctx, func(tx storage.ReadTx) error {
		vals, err := tx.GetMany([][]byte{keyspace.Pending, keyspace.PendingBeat})
		if err != nil {
			return err
		}
		pending, beat = vals[0], vals[1]
		return nil
	})
	if s.stop.Err() != nil {
		return nil, nil, ErrStopped
	}
	return pending, beat, err
}

// rollForward finishes another writer's staged request, which stopped
// showing progress: it takes the reservation over (a new epoch, which fences
// that writer off, and its log parts cleared), stages it again — the same
// index and history entries, since staging is deterministic — and publishes
// it with that writer's batch marker, for its retries.
func (s *Sequencer[Resp]) rollForward(rec []byte) error {
	st, ok := s.app.(Stager[Resp])
	if !ok {
		return fmt.Errorf("revision: a staged write is pending and %T cannot finish it", s.app)
	}
	res, err := s.takeOver(rec)
	if err != nil || res == nil {
		return err
	}
	_, wrote, err := s.stage(s.stop, st, *res, false)
	switch {
	case errors.Is(err, ErrNotPending):
		return nil // published meanwhile
	case s.stop.Err() != nil:
		return ErrStopped
	case err != nil:
		return err
	}
	_, err = s.publish(st, *res, wrote, nil)
	if errors.Is(err, ErrNotPending) {
		return nil
	}
	return err
}

// takeOver moves the reservation recorded as rec to the next epoch, with
// this writer as its owner, and clears the log parts staged for it; nil if
// rec is no longer pending (someone else published or took it).
func (s *Sequencer[Resp]) takeOver(rec []byte) (*Reservation, error) {
	res, err := decodeReservation(rec)
	if err != nil {
		return nil, err
	}
	res.Epoch, res.Owner = res.Epoch+1, s.writer
	taken := encodeReservation(res)
	ctx, cancel := context.WithTimeout(s.stop, s.cfg.CommitTimeout)
	defer cancel()
	err = s.db.Update(ctx, func(tx storage.Tx) error {
		cur, err := tx.Get(keyspace.Pending)
		switch {
		case err != nil:
			return err
		case bytes.Equal(cur, taken):
			return nil // an attempt reported as unknown result took it
		case !bytes.Equal(cur, rec):
			return ErrNotPending
		}
		tx.Set(keyspace.Pending, taken)
		// Part 0 is written at publication; the rest were staged.
		tx.ClearRange(keyspace.Log(res.Base+1, 1), keyspace.LogFrom(res.Base+2))
		return nil
	})
	switch {
	case errors.Is(err, ErrNotPending):
		return nil, nil
	case s.stop.Err() != nil:
		return nil, ErrStopped
	case err != nil:
		return nil, err
	}
	return &res, nil
}

// FinishAbandoned finishes a staged request left pending, at once, without
// waiting for its beat to stand still. Only for storage no other process
// writes, where a reservation found at start-up is certainly abandoned.
func (s *Sequencer[Resp]) FinishAbandoned() error {
	rec, _, err := s.readPending()
	if err != nil || rec == nil {
		return err
	}
	return s.rollForward(rec)
}
