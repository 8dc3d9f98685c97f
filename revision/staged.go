package revision

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// A request too large for one storage transaction (etcd deletes a range or a
// lease's keys of any size in one revision) is written in three steps:
//
//  1. Reserve: one small transaction, on an empty queue of staged writes
//     (no Pending record), records the Reservation under keyspace.Pending:
//     the head H it is evaluated against, so the revision H+1 it takes, and
//     the request itself.
//  2. Stage: the Stager writes the request's mutations at revision H+1 in
//     transactions of its own, several at a time. Readers keep reading at
//     H, which those writes do not change (an index entry newer than the
//     read revision is read from history), and every write that would take
//     a revision waits while Pending exists, on every process.
//  3. Publish: one small transaction moves the head to H+1 (or leaves it, if
//     the request changed nothing), records the batch marker and removes
//     Pending. Readers see the whole request at once.
//
// Staging is deterministic (the request evaluated at H, which nothing can
// change while Pending exists) and idempotent, so any process can finish a
// reservation from the record alone: a writer that stops showing progress
// on keyspace.PendingBeat is taken over by a waiter after BeatTimeout. The
// takeover bumps the reservation's epoch, which fences off the previous
// stager, and clears the log parts staged so far, whose layout depends on
// the stager's configuration; the index and history entries depend on the
// request alone and are simply written again. A crash thus leaves the store
// either before the request (head H, staged writes invisible) or, once
// anyone finishes it, after it. Every staging transaction checks that its
// reservation is still pending in its epoch, so no staged write lands after
// it was published or taken over.

// Stageable is a Request that can be staged: its Apply may answer ErrStage.
type Stageable interface {
	// Reserve validates the request against the store at rev, inside the
	// reservation transaction, and encodes it so that any process can
	// finish it from the encoding alone (Stager.Stage). reqErr fails the
	// request, and nothing is reserved.
	Reserve(tx storage.ReadTx, env Env, rev int64) (encoded []byte, reqErr, err error)
}

// Stager is an Applier that can also write a request in several
// transactions.
type Stager[Resp any] interface {
	Applier
	// Stage writes the mutations of r at revision r.Base+1 in transactions
	// of its own, each of which calls r.Check first. It may run any number
	// of times, also concurrently and after a crash, and writes the same
	// bytes every time. With respond it also builds the response. wrote
	// reports whether the request takes revision r.Base+1.
	Stage(ctx context.Context, r Reservation, respond bool) (resp Resp, wrote bool, err error)
	// Publish adds to the publishing transaction the writes that must
	// appear together with the new head.
	Publish(tx storage.Tx, r Reservation, wrote bool) error
}

// Reservation is a staged request: the revision it takes is Base+1.
type Reservation struct {
	Base  int64
	Env   Env
	ID    RequestID
	Epoch uint32 // bumped by each takeover
	Owner uint64 // the writer staging it in this epoch
	Req   []byte // the Stager's encoding of the request
}

// ErrNotPending: the reservation a staging transaction writes for is no
// longer the pending one (it was published, or taken over).
var ErrNotPending = errors.New("revision: staged request is no longer pending")

// Check fails with ErrNotPending unless r is still pending in tx, in its
// epoch. Staging transactions call it before they write: it reads the head
// and Pending, which only publication and takeover change, so a staging
// transaction that overlaps either conflicts and then finds it so.
func (r Reservation) Check(tx storage.ReadTx) error {
	vals, err := tx.GetMany([][]byte{keyspace.Head, keyspace.Pending})
	if err != nil {
		return err
	}
	head, err := DecodeHead(vals[0])
	if err != nil {
		return err
	}
	if head.Rev != r.Base || vals[1] == nil {
		return ErrNotPending
	}
	cur, err := decodeReservation(vals[1])
	if err != nil {
		return err
	}
	if cur.ID != r.ID || cur.Epoch != r.Epoch || cur.Owner != r.Owner {
		return ErrNotPending
	}
	return nil
}

func encodeReservation(r Reservation) []byte {
	out := make([]byte, 0, 48+len(r.Req))
	out = binary.BigEndian.AppendUint64(out, uint64(r.Base))
	out = binary.BigEndian.AppendUint64(out, uint64(r.Env.Compacted))
	out = binary.BigEndian.AppendUint64(out, r.ID.Writer)
	out = binary.BigEndian.AppendUint64(out, r.ID.Seq)
	out = binary.BigEndian.AppendUint32(out, r.ID.Index)
	out = binary.BigEndian.AppendUint32(out, r.Epoch)
	out = binary.BigEndian.AppendUint64(out, r.Owner)
	return append(out, r.Req...)
}

func decodeReservation(v []byte) (Reservation, error) {
	if len(v) < 48 {
		return Reservation{}, fmt.Errorf("revision: pending record of %d bytes", len(v))
	}
	return Reservation{
		Base: int64(binary.BigEndian.Uint64(v)),
		Env:  Env{Compacted: int64(binary.BigEndian.Uint64(v[8:]))},
		ID: RequestID{
			Writer: binary.BigEndian.Uint64(v[16:]),
			Seq:    binary.BigEndian.Uint64(v[24:]),
			Index:  binary.BigEndian.Uint32(v[32:]),
		},
		Epoch: binary.BigEndian.Uint32(v[36:]),
		Owner: binary.BigEndian.Uint64(v[40:]),
		Req:   bytes.Clone(v[48:]),
	}, nil
}

// commitStaged writes one request through reserve, stage and publish, and
// answers it; it returns 1, the requests it answered.
func (s *Sequencer[Resp]) commitStaged(p *pending[Resp]) int {
	one := []*pending[Resp]{p}
	st, ok := s.app.(Stager[Resp])
	req, stageable := p.Req.(Stageable)
	if !ok || !stageable {
		return failAll(one, 1, ErrTooLarge)
	}
	s.seq++
	id := RequestID{Writer: s.writer, Seq: s.seq}
	res, reqErr, err := s.reserve(st, id, req)
	switch {
	case err != nil:
		// The reservation may have landed, and another writer then
		// publishes it with this marker before this one writes again.
		s.markStale(id.Seq, false)
		return failAll(one, 1, s.classify(err))
	case reqErr != nil:
		return answer(one, []result[Resp]{{err: reqErr}})
	}
	resp, wrote, err := s.stage(context.Background(), st, res, true)
	cleared := false
	if err == nil {
		cleared, err = s.publish(st, res, wrote, s.staleMarkers)
	}
	s.markStale(id.Seq, cleared)
	if err != nil {
		// Unfinished, or finished by another writer before this one could
		// build its answer: its outcome is, to this caller, unknown.
		return failAll(one, 1, fmt.Errorf("%w: staged write: %w", ErrTimeout, err))
	}
	return answer(one, []result[Resp]{{resp: resp}})
}

// errPublished: a reservation attempt found its request already published
// (by a writer that took it over); the response was never built here.
var errPublished = errors.New("revision: staged request published by another writer")

// reserve commits the reservation of req, waiting for any other staged
// write to be published first.
func (s *Sequencer[Resp]) reserve(st Stager[Resp], id RequestID, req Stageable) (Reservation, error, error) {
	for {
		var res Reservation
		var reqErr error
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CommitTimeout)
		err := s.db.Update(ctx, func(tx storage.Tx) error {
			var err error
			res, reqErr, err = s.reserveTx(tx, st, id, req)
			return err
		})
		cancel()
		if d, ok := s.app.(Decider); ok {
			d.Decided(false, nil) // a reservation takes no revision yet
		}
		var pend *errPending
		if errors.As(err, &pend) {
			if err := s.awaitPending(context.Background(), pend.rec); err != nil {
				return Reservation{}, nil, err
			}
			continue
		}
		return res, reqErr, err
	}
}

// reserveTx is one attempt of reserve.
func (s *Sequencer[Resp]) reserveTx(tx storage.Tx, st Stager[Resp], id RequestID, req Stageable) (Reservation, error, error) {
	vals, err := tx.GetMany([][]byte{keyspace.Batch(id.Writer, id.Seq), keyspace.Head, keyspace.Pending})
	if err != nil {
		return Reservation{}, nil, err
	}
	if vals[0] != nil {
		return Reservation{}, nil, errPublished
	}
	if vals[2] != nil {
		cur, err := decodeReservation(vals[2])
		switch {
		case err != nil:
			return Reservation{}, nil, err
		case cur.ID == id && cur.Epoch == 0:
			return cur, nil, nil // an earlier attempt reserved it
		case cur.ID == id:
			return Reservation{}, nil, errPublished // taken over: another writer finishes it
		}
		return Reservation{}, nil, &errPending{rec: vals[2]}
	}
	head, err := DecodeHead(vals[1])
	if err != nil {
		return Reservation{}, nil, err
	}
	env, err := s.app.Begin(tx)
	if err != nil {
		return Reservation{}, nil, err
	}
	enc, reqErr, err := req.Reserve(tx, env, head.Rev)
	if err != nil || reqErr != nil {
		return Reservation{}, reqErr, err
	}
	if invariants {
		checkNothingAbove(tx, head.Rev)
	}
	res := Reservation{Base: head.Rev, Env: env, ID: id, Owner: s.writer, Req: enc}
	tx.Set(keyspace.Pending, encodeReservation(res))
	return res, nil, nil
}

// stage runs the Stager while showing progress on PendingBeat.
func (s *Sequencer[Resp]) stage(ctx context.Context, st Stager[Resp], res Reservation, respond bool) (Resp, bool, error) {
	beatCtx, stopBeat := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.beat(beatCtx, res)
	}()
	resp, wrote, err := st.Stage(ctx, res, respond)
	stopBeat()
	wg.Wait()
	return resp, wrote, err
}

// beat bumps PendingBeat every BeatInterval while res is pending and ctx
// lasts, so that waiters know the staging is alive.
func (s *Sequencer[Resp]) beat(ctx context.Context, res Reservation) {
	for {
		err := s.db.Update(ctx, func(tx storage.Tx) error {
			vals, err := tx.GetMany([][]byte{keyspace.Pending, keyspace.PendingBeat})
			if err != nil {
				return err
			}
			if vals[0] == nil {
				return ErrNotPending
			}
			cur, err := decodeReservation(vals[0])
			if err != nil {
				return err
			}
			if cur.ID != res.ID || cur.Epoch != res.Epoch || cur.Owner != res.Owner {
				return ErrNotPending
			}
			var n uint64
			if len(vals[1]) == 8 {
				n = binary.BigEndian.Uint64(vals[1])
			}
			tx.Set(keyspace.PendingBeat, binary.BigEndian.AppendUint64(nil, n+1))
			return nil
		})
		if errors.Is(err, ErrNotPending) {
			return
		}
		t := time.NewTimer(s.cfg.BeatInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// publish makes a staged request visible: the head moves to res.Base+1 if
// it wrote, the batch marker records it for its writer's retries, and
// Pending goes. stale is the seqs of its own writer's markers that nothing
// replays any more, which the publication clears (nil for a takeover);
// cleared reports that this call's transaction stored the marker, and so
// cleared them.
func (s *Sequencer[Resp]) publish(st Stager[Resp], res Reservation, wrote bool, stale []uint64) (cleared bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CommitTimeout)
	defer cancel()
	err = s.db.Update(ctx, func(tx storage.Tx) error {
		marker, err := tx.Get(keyspace.Batch(res.ID.Writer, res.ID.Seq))
		if err != nil {
			return err
		}
		if marker != nil {
			return errLanded
		}
		if err := res.Check(tx); err != nil {
			return err
		}
		if invariants {
			checkStaged(tx, res.Base, wrote)
		}
		if err := st.Publish(tx, res, wrote); err != nil {
			return err
		}
		if wrote {
			tx.Set(keyspace.Head, encodeHead(Head{Rev: res.Base + 1, Writer: res.ID.Writer, Seq: res.ID.Seq}))
		}
		tx.Set(keyspace.Batch(res.ID.Writer, res.ID.Seq), encodeMarker(res.Base, res.Env, res.Base))
		for _, seq := range stale {
			tx.Clear(keyspace.Batch(res.ID.Writer, seq))
		}
		tx.Clear(keyspace.Pending)
		return nil
	})
	if errors.Is(err, errLanded) {
		return false, nil // an earlier attempt, or a takeover, published it
	}
	return err == nil, err
}
