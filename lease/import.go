package lease

import (
	"fmt"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// WriteImported writes the record of a lease carried over from another etcd
// (a snapshot's lease bucket, a mirrored grant): granted ttl seconds,
// expiring at deadline, with its deadline-index entry. Writing the same
// lease again (a retried transaction) moves the deadline, so it is
// idempotent. Epoch 0 lets the next owner's promotion extend it as it
// extends every lease it takes over.
func WriteImported(tx storage.Tx, id, ttl int64, deadline time.Time) error {
	if id == 0 || ttl <= 0 {
		return fmt.Errorf("lease: import of lease %x with TTL %d", id, ttl)
	}
	old := int64(-1)
	raw, err := tx.Get(keyspace.Lease(id))
	if err != nil {
		return err
	}
	if raw != nil {
		r, err := decodeRecord(raw)
		if err != nil {
			return err
		}
		old = r.Deadline
	}
	setDeadline(tx, id, record{TTL: ttl, Deadline: deadline.UnixMicro()}, old)
	return nil
}

// RemoveImported removes the record of a lease the other etcd no longer
// has (revoked or expired there; its keys' deletions are copied as the
// revisions they were). Like mvcc's revoke it leaves the deadline-index
// entry, which the expiring owner clears when it reaches it.
func RemoveImported(tx storage.Tx, id int64) {
	tx.Clear(keyspace.Lease(id))
}
