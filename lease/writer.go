package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// errExpired refuses a renewal of a lease whose stored deadline has passed:
// it is due for revocation and, as in etcd, cannot be revived.
var errExpired = errors.New("lease: past its deadline")

// writeReq is a grant or a renewal waiting for the group commit.
type writeReq struct {
	grant bool
	id    int64
	ttl   int64  // grant: the TTL to grant
	nonce uint64 // grant: identifies this grant across retried attempts
}

type writeRes struct {
	ttl int64
	rev int64 // grants: the current revision after the commit
}

// writeWaiter is a writeReq in the group-commit queue.
type writeWaiter = groupcommit.Waiter[*writeReq, writeRes]

// commitTimeout bounds one group commit of grants and renewals, retries
// included, so that a storage outage fails the batch instead of holding
// every later grant and renewal behind it.
const commitTimeout = storage.MaxTransactionAge

// submit commits r in the next group commit of grants and renewals and
// returns its outcome.
func (l *Lessor) submit(ctx context.Context, r *writeReq) (writeRes, error) {
	if l.stopped() {
		return writeRes{}, ErrStopped
	}
	return l.writes.Do(ctx, r, 0, l.commitWrites)
}

// slack is how far beyond now+TTL a renewal writes a lease's deadline.
func (l *Lessor) slack(ttl int64) time.Duration {
	return min(l.cfg.RenewSlack, ttlDuration(ttl)/4)
}

type leaseState struct {
	rec    record
	exists bool
	orig   int64 // stored deadline, -1 if there was no record
	dirty  bool
}

// commitWrites commits one batch and answers each of its requests.
func (l *Lessor) commitWrites(batch []*writeWaiter) {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	var a *writeAttempt
	// The batch decides only through what it writes (its errors are the
	// storage's), so it may start from a recent snapshot (storage.Recent).
	err := l.db.Update(storage.WithFreshness(ctx, storage.Recent), func(tx storage.Tx) error {
		a = &writeAttempt{l: l, batch: batch, now: l.clock.Now().UnixMicro()}
		return a.run(tx)
	})
	if err == nil && a.grants {
		err = a.readRev(ctx)
	}
	if err != nil && ctx.Err() != nil {
		// etcd's "request timed out": the batch may or may not have landed.
		err = fmt.Errorf("lease: grants and renewals not committed within %v: %w", commitTimeout, mvcc.ErrTimeout)
	}
	for i, w := range batch {
		if err != nil {
			w.Answer(writeRes{}, err)
			continue
		}
		w.Answer(a.results[i], a.errs[i])
	}
}

// writeAttempt is one attempt of a batch's transaction: a retry starts a
// new one, so nothing of a failed attempt leaks into the answers.
type writeAttempt struct {
	l       *Lessor
	batch   []*writeWaiter
	now     int64 // microseconds
	results []writeRes
	errs    []error
	grants  bool
	wrote   bool // this attempt wrote a record, so it committed
}

func (a *writeAttempt) run(tx storage.Tx) error {
	ids, states, err := a.load(tx)
	if err != nil {
		return err
	}
	a.results, a.errs = make([]writeRes, len(a.batch)), make([]error, len(a.batch))
	for i, w := range a.batch {
		a.results[i], a.errs[i] = a.decide(w.Req, states[w.Req.id])
		a.grants = a.grants || w.Req.grant
	}
	for _, id := range ids {
		if s := states[id]; s.dirty {
			setDeadline(tx, id, s.rec, s.orig)
			a.wrote = true
		}
	}
	return nil
}

// load reads the record of every lease the batch names, once each.
func (a *writeAttempt) load(tx storage.Tx) ([]int64, map[int64]*leaseState, error) {
	states := make(map[int64]*leaseState, len(a.batch))
	var ids []int64
	var keys [][]byte
	for _, w := range a.batch {
		if _, ok := states[w.Req.id]; !ok {
			states[w.Req.id] = &leaseState{orig: -1}
			ids = append(ids, w.Req.id)
			keys = append(keys, keyspace.Lease(w.Req.id))
		}
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return nil, nil, err
	}
	for i, id := range ids {
		if vals[i] == nil {
			continue
		}
		s := states[id]
		if s.rec, err = decodeRecord(vals[i]); err != nil {
			return nil, nil, err
		}
		s.exists, s.orig = true, s.rec.Deadline
	}
	return ids, states, nil
}

// decide applies one grant or renewal to its lease's state, in batch order.
func (a *writeAttempt) decide(r *writeReq, s *leaseState) (writeRes, error) {
	switch {
	case r.grant && s.exists && s.rec.Nonce == r.nonce:
		// An earlier attempt of this commit already granted it.
		return writeRes{ttl: s.rec.TTL}, nil
	case r.grant && s.exists:
		return writeRes{}, ErrLeaseExists
	case r.grant:
		s.rec = record{TTL: r.ttl, Deadline: addSat(a.now, ttlDuration(r.ttl)), Nonce: r.nonce}
		s.exists, s.dirty = true, true
		return writeRes{ttl: r.ttl}, nil
	case !s.exists:
		return writeRes{}, ErrLeaseNotFound
	case s.rec.Deadline <= a.now:
		return writeRes{}, errExpired
	}
	d := addSat(addSat(a.now, ttlDuration(s.rec.TTL)), a.l.slack(s.rec.TTL))
	if d > s.rec.Deadline {
		s.rec.Deadline, s.dirty = d, true
	}
	return writeRes{ttl: s.rec.TTL}, nil
}

// readRev reads the revision grants report: the current one after the
// commit. etcd reports the revision its grant applied at, which includes
// every write acknowledged before the grant arrived; so does any snapshot
// at least as new as the grant's commit, and a Recent View reads no older
// than a commit its DB made (storage.Recent): on FoundationDB, no read
// version round trip of its own. An attempt that committed nothing (a retry
// that found its grants stored by an attempt whose commit was reported
// unknown) has no such commit, and reads the latest.
func (a *writeAttempt) readRev(ctx context.Context) error {
	if a.wrote {
		ctx = storage.WithFreshness(ctx, storage.Recent)
	}
	var h revision.Head
	err := a.l.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		h, err = revision.ReadHead(tx)
		return err
	})
	for i := range a.results {
		a.results[i].rev = h.Rev
	}
	return err
}
