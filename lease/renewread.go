package lease

import (
	"bytes"
	"context"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
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
// arrived. A lease kept alive again does not even need its record read:
// the read also takes mvcc.LeaseRemovedKey, and while that is unchanged
// the record read last time still covers it (renewcache.go). On
// FoundationDB a batch is then two read requests, however many
// keep-alives it answers, instead of a transaction per keep-alive.

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

// readRecords reads the head, mvcc.LeaseRemovedKey and the records of a
// batch of keep-alives in one transaction and answers each; a keep-alive
// whose record the cache holds with a deadline that covers it reads no
// record while the key is unchanged. The transaction is bounded by the
// lessor's life and commitTimeout, not by any one caller, whose leaving
// must not fail the others.
func (l *Lessor) readRecords(batch []*readWaiter) {
	ctx, cancel := context.WithTimeout(l.ctx, commitTimeout)
	defer cancel()
	ids := make([]int64, len(batch))
	for i, w := range batch {
		ids[i] = w.Req
	}
	var r sharedRead
	mark, known, cached := l.renewed.lookup(ids, l.clock.Now().UnixMicro())
	err := l.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		r, err = readShared(tx, ids, cached, mark, known)
		return err
	})
	if err == nil {
		l.renewed.update(r.mark, ids, r.raws)
	}
	for i, w := range batch {
		if err != nil {
			w.Answer(recordRead{}, l.stoppedOr(err))
			continue
		}
		w.Answer(recordRead{raw: r.raws[i], rev: r.rev}, nil)
	}
}

// sharedRead is what one shared read found: the current revision, the
// value of mvcc.LeaseRemovedKey, and each keep-alive's record.
type sharedRead struct {
	rev  int64
	mark []byte
	raws [][]byte
}

// readShared reads the head, the key and the records of ids that cached
// does not hold, at once; cached, read while the key was mark (known), is
// trusted if the key still is, and read again otherwise.
func readShared(tx storage.ReadTx, ids []int64, cached [][]byte, mark []byte, known bool) (sharedRead, error) {
	keys := [][]byte{keyspace.Head, mvcc.LeaseRemovedKey}
	for i, id := range ids {
		if cached[i] == nil {
			keys = append(keys, keyspace.Lease(id))
		}
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return sharedRead{}, err
	}
	h, err := revision.DecodeHead(vals[0])
	if err != nil {
		return sharedRead{}, err
	}
	r := sharedRead{rev: h.Rev, mark: vals[1], raws: make([][]byte, len(ids))}
	trusted := known && bytes.Equal(mark, r.mark)
	var again []int
	next := vals[2:]
	for i := range ids {
		switch {
		case cached[i] == nil:
			r.raws[i], next = next[0], next[1:]
		case trusted:
			r.raws[i] = cached[i]
		default:
			again = append(again, i)
		}
	}
	return r, readAgain(tx, r.raws, ids, again)
}

// readAgain reads the records of ids[again...] into raws: cached records
// whose key changed since they were read.
func readAgain(tx storage.ReadTx, raws [][]byte, ids []int64, again []int) error {
	if len(again) == 0 {
		return nil
	}
	keys := make([][]byte, len(again))
	for j, i := range again {
		keys[j] = keyspace.Lease(ids[i])
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return err
	}
	for j, i := range again {
		raws[i] = vals[j]
	}
	return nil
}
