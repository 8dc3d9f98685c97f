package revision

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// errShrink aborts an attempt whose batch must be cut to its first n
// requests: it outgrew BatchBytes, request n asked to be staged, or the
// previous attempt ran so long that a transaction this size risks its age
// limit.
type errShrink struct{ n int }

func (e errShrink) Error() string { return fmt.Sprintf("revision: batch cut at request %d", e.n) }

// errLanded aborts an attempt (without committing) that found its batch
// already committed; the responses it rebuilt are the answer.
var errLanded = errors.New("revision: batch already committed")

// errYield aborts a retry that Config.Yield gives up.
var errYield = errors.New("revision: batch yields")

// errStageFirst aborts an attempt whose first request asked to be staged.
var errStageFirst = errors.New("revision: first request must be staged")

// errPending aborts an attempt that found a staged write in progress: no
// revision can be taken until it is published. rec is the Pending value.
type errPending struct{ rec []byte }

func (e *errPending) Error() string { return "revision: a staged write is in progress" }

// slowAttempt is how long an attempt may take before the retry of a batch
// of several requests is cut in half: half of FoundationDB's transaction
// age, so that a batch whose evaluation grew too slow (1007) shrinks
// instead of failing again at the same size.
const slowAttempt = storage.MaxTransactionAge / 2

// maxStaleMarkers bounds the decided markers a writer remembers to clear
// (Sequencer.staleMarkers). Only failed batches and staged requests that
// did not publish themselves add to it between two writes that clear it;
// beyond the bound the oldest are left behind, as a stopped writer's are,
// for the compactor to clear once they expire.
const maxStaleMarkers = 256

// commitPrefix commits as many requests from the front of batch as fit and
// answers them; it returns how many it answered, or, having answered none,
// the Pending record of the staged write the batch must wait for. Every
// attempt, the cut batches' included, runs before one deadline
// CommitTimeout away, so that a batch that shrinks holds the sequencer no
// longer than one that does not.
func (s *Sequencer[Resp]) commitPrefix(batch []*pending[Resp]) (answered int, staged []byte) {
	deadline := s.cfg.Now().Add(s.cfg.CommitTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CommitTimeout)
	defer cancel()
	// A batch decides only through what it writes (its errors are about
	// sizes, or a staged write it then awaits with fresh reads), so it may
	// start from a recent snapshot: on FoundationDB the writer's previous
	// commit, without a read version round trip.
	ctx = storage.WithFreshness(ctx, storage.Recent)
	for {
		if !s.cfg.Now().Before(deadline) {
			// Cut past its deadline: no attempt of it committed.
			return failAll(batch, len(batch), fmt.Errorf("%w: batch cut after %v", ErrTimeout, s.cfg.CommitTimeout)), nil
		}
		s.seq++
		a := &attempt[Resp]{s: s, batch: batch, seq: s.seq, results: make([]result[Resp], len(batch))}
		start := s.cfg.Now()
		s.batchStarted()
		err := s.db.Update(ctx, a.run)
		if a.uncertain && givesBack(err, len(batch)) {
			err = s.fence(ctx, a, err)
		}
		if d, ok := s.app.(Decider); ok {
			if err == nil {
				d.Decided(true, a.headValue)
			} else {
				d.Decided(false, nil)
			}
		}
		s.batchDecided()
		var shrink errShrink
		var pend *errPending
		switch {
		case errors.As(err, &shrink):
			batch = batch[:shrink.n]
			continue
		case errors.As(err, &pend):
			return 0, pend.rec // nothing of the batch committed
		case errors.Is(err, errStageFirst):
			return s.commitStaged(batch[0]), nil
		case errors.Is(err, errLanded):
			err = nil
		case errors.Is(err, errYield):
			return failAll(batch, len(batch), ErrYielded), nil // fenced: none applied
		case err != nil && len(batch) > 1 && tooLarge(err):
			batch = batch[:len(batch)/2]
			continue
		}
		if err != nil {
			// An attempt may have committed: its marker, if stored, is
			// decided now.
			s.markStale(a.seq, false)
			return failAll(batch, len(batch), s.classify(err)), nil
		}
		if invariants && a.newHead > 0 {
			s.checkMonotonic(a.base, a.newHead)
		}
		if a.marked {
			s.markStale(a.seq, true)
		}
		if s.cfg.Observe != nil {
			s.cfg.Observe(len(batch), a.written, s.cfg.Now().Sub(start))
		}
		return answer(batch, a.results), nil
	}
}

// classify turns a storage failure of the write path into the sequencer's
// errors: a transaction too large for the storage, or one that could not
// commit in time (the deadline, or a backend that gave up retrying).
func (s *Sequencer[Resp]) classify(err error) error {
	switch {
	case errors.Is(err, ErrStopped) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrTooLarge):
		return err
	case errors.Is(err, errPublished):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	case tooLarge(err):
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	case errors.Is(err, context.DeadlineExceeded) || storage.Retryable(err):
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}

// givesBack reports whether an attempt's outcome hands the requests of its
// batch of n to a later batch without having committed them.
func givesBack(err error, n int) bool {
	var shrink errShrink
	var pend *errPending
	return errors.As(err, &shrink) || errors.As(err, &pend) || errors.Is(err, errStageFirst) || errors.Is(err, errYield) ||
		(n > 1 && tooLarge(err))
}

// fence settles an attempt that gives its batch back (givesBack) after a
// run that went to commit and failed: that commit may have been reported
// unknown (1021) and still land, and the requests would then be applied
// twice, by it and by the batch that takes them again. One transaction
// either finds the attempt's marker — the commit landed: the answers are
// rebuilt from it (errLanded) — or rewrites the head as it is. Every run
// of the attempt read the head, so a commit still in flight conflicts
// with that write and never lands. It returns cause once fenced.
func (s *Sequencer[Resp]) fence(ctx context.Context, a *attempt[Resp], cause error) error {
	err := s.db.Update(ctx, func(tx storage.Tx) error {
		vals, err := tx.GetMany([][]byte{keyspace.Head, keyspace.Batch(s.writer, a.seq)})
		if err != nil {
			return err
		}
		if vals[1] != nil {
			if err := a.replay(tx, vals[1]); err != nil {
				return err
			}
			a.marked = true
			return errLanded
		}
		if vals[0] != nil {
			tx.Set(keyspace.Head, vals[0])
		} else {
			tx.Clear(keyspace.Head) // still revision 1; the write is the fence
		}
		return nil
	})
	if err == nil {
		return cause
	}
	return err
}

func tooLarge(err error) bool {
	return errors.Is(err, storage.ErrTransactionTooLarge) ||
		errors.Is(err, storage.ErrKeyTooLarge) || errors.Is(err, storage.ErrValueTooLarge)
}

// attempt is one batch's transaction function and what its last run found.
type attempt[Resp any] struct {
	s       *Sequencer[Resp]
	batch   []*pending[Resp]
	seq     uint64
	results []result[Resp]
	written int
	base    int64 // the head the batch applied on
	newHead int64 // the head it wrote, 0 if it wrote none
	// headValue is the head key's value it wrote, nil if none.
	headValue []byte
	marked    bool // its marker is stored: the batch wrote, or an earlier attempt did
	// committing: the last run returned to commit its writes. A run after
	// one that did makes the attempt uncertain: that commit failed, and it
	// may have been reported unknown and land later (fence).
	committing, uncertain bool

	runs     int
	lastTook time.Duration
}

func (a *attempt[Resp]) run(tx storage.Tx) error {
	s := a.s
	began := s.cfg.Now()
	defer func() { a.lastTook = s.cfg.Now().Sub(began) }()
	a.runs++
	a.uncertain = a.uncertain || a.committing
	a.written, a.newHead, a.headValue, a.marked, a.committing = 0, 0, nil, false, false
	// The batch marker can only exist once an attempt of this batch has
	// run (the writer is new to each process and seq to each batch), so the
	// first attempt does not read it; a retry reads it with the head, in the
	// same round trip.
	keys := [][]byte{keyspace.Head, keyspace.Pending}
	if a.runs > 1 {
		keys = append(keys, keyspace.Batch(s.writer, a.seq))
	}
	keys = append(keys, a.prefetch()...)
	vals, err := tx.GetMany(keys)
	if err != nil {
		return err
	}
	if a.runs > 1 && vals[2] != nil {
		if err := a.replay(tx, vals[2]); err != nil {
			return err
		}
		a.marked = true
		return errLanded
	}
	// Only now, knowing that no earlier attempt landed, may the batch be
	// cut or given up (an uncertain one is fenced first: givesBack).
	if a.runs > 1 && s.cfg.Yield != nil && s.cfg.Yield() {
		return errYield
	}
	if a.runs > 1 && len(a.batch) > 1 && a.lastTook > slowAttempt {
		return errShrink{n: len(a.batch) / 2}
	}
	if vals[1] != nil {
		return &errPending{rec: vals[1]}
	}
	head, err := DecodeHead(vals[0])
	if err != nil {
		return err
	}
	cached := storage.NewCachedTx(tx, keys, vals)
	env, err := s.app.Begin(cached)
	if err != nil {
		return err
	}
	if invariants {
		checkNothingAbove(tx, head.Rev)
	}
	if err := a.apply(cached, head.Rev, env); err != nil {
		return err
	}
	a.committing = a.marked
	return nil
}

// maxPrefetch bounds the keys one batch reads ahead; a batch of many large
// requests reads the rest as it evaluates them.
const maxPrefetch = 4096

// prefetch is the keys the applier and the batch's requests will read, as
// far as they say.
func (a *attempt[Resp]) prefetch() [][]byte {
	var keys [][]byte
	if p, ok := a.s.app.(Prefetcher); ok {
		keys = p.Prefetch(keys)
	}
	for _, b := range a.batch {
		if p, ok := b.Req.(Prefetcher); ok {
			keys = p.Prefetch(keys)
		}
		if len(keys) >= maxPrefetch {
			return keys[:maxPrefetch]
		}
	}
	return keys
}

// apply evaluates the batch on top of revision base and writes the head and
// the batch marker.
func (a *attempt[Resp]) apply(tx storage.Tx, base int64, env Env) error {
	s := a.s
	ctr := &countingTx{Tx: tx}
	start, rev := env, base
	for i, p := range a.batch {
		id := RequestID{Writer: s.writer, Seq: a.seq, Index: uint32(i)}
		resp, wrote, reqErr, err := p.Req.Apply(ctr, &env, rev, id)
		switch {
		case err != nil:
			return err
		case errors.Is(reqErr, ErrStage) && i == 0:
			return errStageFirst
		case errors.Is(reqErr, ErrStage):
			return errShrink{n: i}
		case ctr.bytes > s.cfg.BatchBytes && i > 0:
			return errShrink{n: i}
		}
		a.results[i] = result[Resp]{resp: resp, err: reqErr}
		if wrote {
			rev++
			if invariants {
				checkLogged(tx, rev)
			}
		}
	}
	a.written = ctr.bytes
	if ctr.bytes == 0 {
		return nil // nothing written; nothing to make idempotent
	}
	if rev != base {
		a.headValue = encodeHead(Head{Rev: rev, Writer: s.writer, Seq: a.seq})
		tx.Set(keyspace.Head, a.headValue)
		a.base, a.newHead = base, rev
	}
	tx.Set(keyspace.Batch(s.writer, a.seq), encodeMarker(base, start, a.floor(base)))
	a.marked = true
	s.clearStaleMarkers(tx)
	return nil
}

// clearStaleMarkers clears the writer's decided markers (usually one, its
// previous batch's): nothing replays them, and physical compaction need not
// wait for them (ReplayableMarkers). Point deletes of known keys: range
// deletions would pile up as tombstones on every batch.
func (s *Sequencer[Resp]) clearStaleMarkers(tx storage.Tx) {
	for _, seq := range s.staleMarkers {
		tx.Clear(keyspace.Batch(s.writer, seq))
	}
}

// markStale records that the marker of this writer's batch or staged
// request seq, if it is stored or ever will be, is decided: no retry of
// this writer replays it. cleared says the write that stored it also
// cleared the markers decided before.
func (s *Sequencer[Resp]) markStale(seq uint64, cleared bool) {
	if cleared {
		s.staleMarkers = s.staleMarkers[:0]
	}
	s.staleMarkers = append(s.staleMarkers, seq)
	if len(s.staleMarkers) > maxStaleMarkers {
		s.staleMarkers = slices.Delete(s.staleMarkers, 0, len(s.staleMarkers)-maxStaleMarkers)
	}
}

// replay rebuilds the responses of a batch an earlier attempt committed,
// under the Env that attempt evaluated against.
func (a *attempt[Resp]) replay(tx storage.ReadTx, marker []byte) error {
	base, env, _, err := decodeMarker(marker)
	if err != nil {
		return err
	}
	rev := base
	for i, p := range a.batch {
		id := RequestID{Writer: a.s.writer, Seq: a.seq, Index: uint32(i)}
		resp, wrote, reqErr, err := p.Req.Replay(tx, &env, rev, id)
		if err != nil {
			return err
		}
		a.results[i] = result[Resp]{resp: resp, err: reqErr}
		if wrote {
			rev++
		}
	}
	return nil
}

// A batch marker records the head the batch applied on, the Env it
// started with, and the lowest revision its requests read (floor): a replay
// reads the store as of nothing older.
func encodeMarker(base int64, env Env, floor int64) []byte {
	out := binary.BigEndian.AppendUint64(make([]byte, 0, 24), uint64(base))
	out = binary.BigEndian.AppendUint64(out, uint64(env.Compacted))
	return binary.BigEndian.AppendUint64(out, uint64(floor))
}

// decodeMarker also reads the markers of earlier versions, which had no
// floor: their requests may have read any revision since the compaction.
func decodeMarker(v []byte) (base int64, env Env, floor int64, err error) {
	if len(v) != 16 && len(v) != 24 {
		return 0, Env{}, 0, fmt.Errorf("revision: batch marker of %d bytes", len(v))
	}
	base, env = int64(binary.BigEndian.Uint64(v)), Env{Compacted: int64(binary.BigEndian.Uint64(v[8:]))}
	if len(v) == 16 {
		return base, env, env.Compacted, nil
	}
	return base, env, int64(binary.BigEndian.Uint64(v[16:])), nil
}

// floor is the lowest revision the batch's requests read: base, or an
// older explicit revision one of them reads at (ReadFloorer).
func (a *attempt[Resp]) floor(base int64) int64 {
	floor := base
	for _, p := range a.batch {
		if f, ok := p.Req.(ReadFloorer); ok {
			if r := f.ReadFloor(); r > 0 && r < floor {
				floor = r
			}
		}
	}
	return floor
}

// countingTx measures the bytes a batch writes, to keep it under BatchBytes.
type countingTx struct {
	storage.Tx
	bytes int
}

func (c *countingTx) Set(k, v []byte) {
	c.bytes += len(k) + len(v)
	c.Tx.Set(k, v)
}

func (c *countingTx) Clear(k []byte) {
	c.bytes += len(k)
	c.Tx.Clear(k)
}

func (c *countingTx) ClearRange(b, e []byte) {
	c.bytes += len(b) + len(e)
	c.Tx.ClearRange(b, e)
}
