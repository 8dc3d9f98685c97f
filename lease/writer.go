package lease

import (
	"context"
	"errors"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
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
	out   chan writeRes
}

type writeRes struct {
	ttl int64
	rev int64 // grants: the current revision after the commit
	err error
}

// submit queues r for the group commit and waits for its outcome.
func (l *Lessor) submit(ctx context.Context, r *writeReq) (writeRes, error) {
	r.out = make(chan writeRes, 1)
	if l.stopped() {
		return writeRes{}, ErrStopped
	}
	select {
	case l.writes <- r:
	case <-ctx.Done():
		return writeRes{}, ctx.Err()
	case <-l.stop:
		return writeRes{}, ErrStopped
	}
	select {
	case res := <-r.out:
		return res, res.err
	case <-ctx.Done():
		return writeRes{}, ctx.Err()
	case <-l.writerDone:
		select {
		case res := <-r.out:
			return res, res.err
		default:
			return writeRes{}, ErrStopped // queued after the writer's last drain
		}
	}
}

// writer group-commits grants and renewals: whatever queued while the
// previous commit ran goes into the next one.
func (l *Lessor) writer() {
	defer l.wg.Done()
	defer close(l.writerDone)
	for {
		var first *writeReq
		select {
		case first = <-l.writes:
		case <-l.stop:
			for {
				select {
				case r := <-l.writes:
					r.out <- writeRes{err: ErrStopped}
				default:
					return
				}
			}
		}
		batch := []*writeReq{first}
	collect:
		for len(batch) < l.cfg.WriteBatch {
			select {
			case r := <-l.writes:
				batch = append(batch, r)
			default:
				break collect
			}
		}
		l.commitWrites(batch)
	}
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

func (l *Lessor) commitWrites(batch []*writeReq) {
	results := make([]writeRes, len(batch))
	grants := false
	err := l.db.Update(context.Background(), func(tx storage.Tx) error {
		now := l.clock.Now().UnixMicro()
		states := make(map[int64]*leaseState, len(batch))
		var ids []int64
		var keys [][]byte
		for _, r := range batch {
			if _, ok := states[r.id]; !ok {
				states[r.id] = &leaseState{}
				ids = append(ids, r.id)
				keys = append(keys, keyspace.Lease(r.id))
			}
		}
		vals, err := tx.GetMany(keys)
		if err != nil {
			return err
		}
		for i, id := range ids {
			s := states[id]
			s.orig = -1
			if vals[i] != nil {
				if s.rec, err = decodeRecord(vals[i]); err != nil {
					return err
				}
				s.exists, s.orig = true, s.rec.Deadline
			}
		}
		for i, r := range batch {
			s := states[r.id]
			switch {
			case r.grant && s.exists && s.rec.Nonce == r.nonce:
				// An earlier attempt of this commit already granted it.
				results[i] = writeRes{ttl: s.rec.TTL}
			case r.grant && s.exists:
				results[i] = writeRes{err: ErrLeaseExists}
			case r.grant:
				s.rec = record{TTL: r.ttl, Deadline: addSat(now, ttlDuration(r.ttl)), Nonce: r.nonce}
				s.exists, s.dirty = true, true
				results[i] = writeRes{ttl: r.ttl}
			case !s.exists:
				results[i] = writeRes{err: ErrLeaseNotFound}
			case s.rec.Deadline <= now:
				results[i] = writeRes{err: errExpired}
			default:
				d := addSat(addSat(now, ttlDuration(s.rec.TTL)), l.slack(s.rec.TTL))
				if d > s.rec.Deadline {
					s.rec.Deadline, s.dirty = d, true
				}
				results[i] = writeRes{ttl: s.rec.TTL}
			}
			if r.grant {
				grants = true
			}
		}
		for _, id := range ids {
			if s := states[id]; s.dirty {
				setDeadline(tx, id, s.rec, s.orig)
			}
		}
		return nil
	})
	if err == nil && grants {
		var rev int64
		err = l.db.View(context.Background(), func(tx storage.ReadTx) error {
			h, err := revision.ReadHead(tx)
			rev = h.Rev
			return err
		})
		for i := range results {
			results[i].rev = rev
		}
	}
	for i, r := range batch {
		if err != nil {
			results[i] = writeRes{err: err}
		}
		r.out <- results[i]
	}
}
