package tenant

import (
	"context"
	"errors"
	"slices"

	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Each running tenant's server renews its write ownership (package owner)
// every few hundred milliseconds: a small transaction that reads one key
// and writes it back. A thousand connected tenants made that 1,333
// transactions a second on FoundationDB with no client doing anything, and
// the client's network thread spent most of a process's CPU at rest on
// them. So these transactions, from every tenant of the process, meet in one
// transaction of the shared store (groupcommit's queue, without a goroutine
// of its own): every member's keys are read in one round trip and every
// member's writes committed together. The owner aligns its renewals on its
// interval when its store offers this (owner.SharedUpdater), so that the
// tenants' renewals of one interval arrive together.

// sharedBatch bounds the members of one shared transaction: each reads and
// writes a record of a few dozen bytes, so even the largest batch stays far
// below a transaction's limits.
const sharedBatch = 1000

// sharedTimeout bounds one shared transaction, retries included: the
// members' own deadlines do not apply once a batch has taken them, and
// one member's end must not fail the others.
const sharedTimeout = storage.MaxTransactionAge

// sharedUpdate is one member of a shared transaction.
type sharedUpdate struct {
	db    *DB
	keys  [][]byte // read for it, with its fence, before any member runs
	outer [][]byte // keys of the shared store read with them
	fn    func(tx, outer storage.Tx) error
}

type sharedWaiter = groupcommit.Waiter[sharedUpdate, struct{}]

var _ owner.SharedUpdater = (*DB)(nil)

// sharedUpdates is the process's queue of shared transactions over one
// store.
type sharedUpdates struct {
	inner storage.DB
	q     *groupcommit.Queue[sharedUpdate, struct{}]
}

func newSharedUpdates(inner storage.DB) *sharedUpdates {
	return &sharedUpdates{inner: inner,
		q: groupcommit.New[sharedUpdate, struct{}](groupcommit.Limits{MaxBatch: sharedBatch}, storage.ErrClosed)}
}

// UpdateShared runs fn on the tenant's keys like Update, in a transaction
// it may share with other tenants' calls; fn's outer is the same
// transaction on the shared store's own keys (outside every tenant: the
// processes' beats, package owner). keys (the tenant's) and outerKeys are
// read first, with the others' keys, in one batch. A failure of another
// member (its tenant deleted meanwhile) never fails this one. Without a
// process-wide queue (a DB from NewDB) it runs in a transaction of its
// own.
func (d *DB) UpdateShared(ctx context.Context, keys, outerKeys [][]byte, fn func(tx, outer storage.Tx) error) error {
	if d.shared == nil {
		return d.updateOuter(ctx, fn)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.inflight.Done()
	_, err := d.shared.q.Do(ctx, sharedUpdate{db: d, keys: keys, outer: outerKeys, fn: fn}, 0, d.shared.commit)
	return err
}

// memberFailed ends a shared attempt in which member i failed with err,
// which a retry would not change: the batch is retried without it.
type memberFailed struct {
	i   int
	err error
}

func (m *memberFailed) Error() string {
	return "tenant: member of a shared transaction failed: " + m.err.Error()
}

// commit runs batch in one transaction of the shared store. A member that
// fails for a reason of its own is answered with it and the rest retried
// in a new transaction, so that its partial writes never commit.
func (s *sharedUpdates) commit(batch []*sharedWaiter) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	for len(batch) > 0 {
		keys := sharedKeys(batch)
		err := s.inner.Update(ctx, func(itx storage.Tx) error { return runShared(itx, batch, keys) })
		var mf *memberFailed
		if errors.As(err, &mf) {
			batch[mf.i].Answer(struct{}{}, mf.err)
			batch = slices.Delete(batch, mf.i, mf.i+1)
			continue
		}
		for _, w := range batch {
			w.Answer(struct{}{}, err)
		}
		return
	}
}

// sharedKeys is what a shared transaction of batch reads first: every
// member's fence and keys, in the shared store.
func sharedKeys(batch []*sharedWaiter) [][]byte {
	var keys [][]byte
	for _, w := range batch {
		d := w.Req.db
		keys = append(keys, d.live)
		for _, k := range w.Req.keys {
			keys = append(keys, d.key(k))
		}
		keys = append(keys, w.Req.outer...)
	}
	return keys
}

// runShared is one attempt of a shared transaction: keys (sharedKeys) are
// read in one batch, then each member runs on its tenant's view, its reads
// of those keys answered from what the batch read.
func runShared(itx storage.Tx, batch []*sharedWaiter, keys [][]byte) error {
	vals, err := itx.GetMany(keys)
	if err != nil {
		return err
	}
	read := storage.NewCachedTx(itx, keys, vals)
	for i, w := range batch {
		t := w.Req.db.wrap(read, read)
		err := w.Req.fn(t.(storage.Tx), read)
		if err == nil {
			err = t.fenceOf().check()
		}
		switch {
		case err == nil:
		case storage.Retryable(err):
			return err
		default:
			return &memberFailed{i: i, err: err}
		}
	}
	return nil
}
