package lease

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Stored state of the lease layer. mvcc owns the lease record key (it checks
// a record exists before attaching a key and removes it on revoke) and the
// attachments; the lessor owns the record's value and two families under
// keyspace.Singleton (expiry ownership is package owner's record):
//
//	keyspace.Lease(id)                     record: granted TTL, deadline, grant nonce, promotion epoch
//	Singleton("lease/expiry/") d id        deadline index: one entry per record, ordered by deadline
//	Singleton("lease/wake")                the last deadline written that may be the earliest (d id)
//
// Every write of a record's deadline moves its index entry in the same
// transaction. mvcc's revoke clears the record but not the index entry; the
// expiring owner clears such stale entries when it reaches them.

var (
	indexPrefix = keyspace.Singleton("lease/expiry/")
	indexEnd    = storage.Strinc(indexPrefix)
	// wakeKey changes whenever a deadline is written that may come before
	// every deadline the index held: a new lease's, or one moved earlier.
	// The expiring owner, with nothing due for a while, waits for it to
	// change (a FoundationDB watch) instead of re-reading the index every
	// ScanInterval; renewals and promotions only move deadlines later, so
	// they leave it alone. Its value is the index entry's suffix, which
	// differs for every (deadline, lease) written.
	wakeKey = keyspace.Singleton("lease/wake")
)

const recordVersion = 1

// record is a lease's stored value.
type record struct {
	TTL      int64  // granted TTL in seconds, after the minimum was applied
	Deadline int64  // unix microseconds at which the lease expires, by the wall clock of the process that wrote it
	Nonce    uint64 // identifies the grant, so a retried grant recognises itself
	Epoch    uint64 // the ownership epoch that last extended it on promotion
}

const recordLen = 1 + 8 + 8 + 8 + 8

var errCorrupt = errors.New("lease: corrupt record")

func (r record) encode() []byte {
	out := make([]byte, 1, recordLen)
	out[0] = recordVersion
	out = binary.BigEndian.AppendUint64(out, uint64(r.TTL))
	out = binary.BigEndian.AppendUint64(out, uint64(r.Deadline))
	out = binary.BigEndian.AppendUint64(out, r.Nonce)
	return binary.BigEndian.AppendUint64(out, r.Epoch)
}

func decodeRecord(b []byte) (record, error) {
	if len(b) != recordLen || b[0] != recordVersion {
		return record{}, errCorrupt
	}
	return record{
		TTL:      int64(binary.BigEndian.Uint64(b[1:])),
		Deadline: int64(binary.BigEndian.Uint64(b[9:])),
		Nonce:    binary.BigEndian.Uint64(b[17:]),
		Epoch:    binary.BigEndian.Uint64(b[25:]),
	}, nil
}

// indexKey is the deadline-index entry of lease id expiring at deadline.
func indexKey(deadline int64, id int64) []byte {
	out := make([]byte, 0, len(indexPrefix)+16)
	out = append(out, indexPrefix...)
	out = binary.BigEndian.AppendUint64(out, uint64(max(deadline, 0)))
	return binary.BigEndian.AppendUint64(out, uint64(id))
}

// indexUpTo is the end of the index range of deadlines before deadline.
func indexUpTo(deadline int64) []byte {
	out := make([]byte, 0, len(indexPrefix)+8)
	out = append(out, indexPrefix...)
	return binary.BigEndian.AppendUint64(out, uint64(max(deadline, 0)))
}

func parseIndex(k []byte) (deadline int64, id int64, err error) {
	if len(k) != len(indexPrefix)+16 {
		return 0, 0, errCorrupt
	}
	b := k[len(indexPrefix):]
	return int64(binary.BigEndian.Uint64(b)), int64(binary.BigEndian.Uint64(b[8:])), nil
}

// addSat adds d to the unix-microsecond time t, saturating instead of
// overflowing.
func addSat(t int64, d time.Duration) int64 {
	us := d.Microseconds()
	if us > 0 && t > math.MaxInt64-us {
		return math.MaxInt64
	}
	return t + us
}

// ttlDuration converts a TTL in seconds to a duration, saturating (a
// duration holds MaxLeaseTTL; deadlines are kept in microseconds so that
// now+MaxLeaseTTL fits).
func ttlDuration(ttl int64) time.Duration {
	if ttl > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(ttl) * time.Second
}

// setDeadline writes rec with a new deadline, moving its index entry; old is
// the deadline of the stored record, or -1 if there was none.
func setDeadline(tx storage.Tx, id int64, rec record, old int64) {
	if old >= 0 && old != rec.Deadline {
		tx.Clear(indexKey(old, id))
	}
	tx.Set(keyspace.Lease(id), rec.encode())
	entry := indexKey(rec.Deadline, id)
	tx.Set(entry, nil)
	if old < 0 || rec.Deadline < old {
		tx.Set(wakeKey, entry[len(indexPrefix):])
	}
}
