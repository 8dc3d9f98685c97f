package lease

import (
	"context"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// A keep-alive whose stored deadline already covers now+TTL is answered
// from a read of the lease's record and the head. Concurrent keep-alives
// share that read: the first caller to find no read in progress reads the
// records of every keep-alive queued by then in one transaction, with the
// head once, and the keep-alives arriving meanwhile share the next one
// (groupcommit's queue, without a goroutine of its own). The transaction
// starts after each of its keep-alives arrived, so each sees everything a
// read of its own would have: a revoke or renewal that completed before it
// arrived. On FoundationDB that is one read request per keep-alive and one
// for the batch, instead of two and a transaction per keep-alive.

// recordRead is what a keep-alive's read found: the raw record (nil if
// there is none) and the current revision.
type recordRead struct {
	raw []byte
	rev int64
}

// readWaiter is a keep-alive's read in the queue.
type readWaiter = groupcommit.Waiter[int64, recordRead]

// newReadQueue is the queue of keep-alive reads, at most max to a
// transaction, gathering for up to gather.
func newReadQueue(max int, gather time.Duration) *groupcommit.Queue[int64, recordRead] {
	return groupcommit.New[int64, recordRead](groupcommit.Limits{MaxBatch: max, Gather: gather}, ErrStopped)
}

// readRecordShared reads lease id's record and the current revision in the
// next shared read.
func (l *Lessor) readRecordShared(ctx context.Context, id int64) (recordRead, error) {
	return l.reads.Do(ctx, id, 0, l.readRecords)
}

// readRecords reads the records of a batch of keep-alives and the head in
// one transaction and answers each. The transaction is bounded by the
// lessor's life and commitTimeout, not by any one caller, whose leaving
// must not fail the others.
func (l *Lessor) readRecords(batch []*readWaiter) {
	ctx, cancel := context.WithTimeout(l.ctx, commitTimeout)
	defer cancel()
	keys := make([][]byte, len(batch)+1)
	keys[0] = keyspace.Head
	for i, w := range batch {
		keys[i+1] = keyspace.Lease(w.Req)
	}
	var vals [][]byte
	var rev int64
	err := l.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		if vals, err = tx.GetMany(keys); err != nil {
			return err
		}
		h, err := revision.DecodeHead(vals[0])
		rev = h.Rev
		return err
	})
	for i, w := range batch {
		if err != nil {
			w.Answer(recordRead{}, l.stoppedOr(err))
			continue
		}
		w.Answer(recordRead{raw: vals[i+1], rev: rev}, nil)
	}
}
