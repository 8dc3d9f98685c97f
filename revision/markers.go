package revision

import (
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Marker is a batch marker as physical compaction sees it: a committed
// batch that a retry of its writer may still replay, reading the store as
// of no revision older than Floor. A writer clears its marker in its next
// write (a batch, or the publication of a staged request), once nothing can
// replay it; what remains is each writer's newest one, and the markers of
// writers that stopped.
type Marker struct {
	Key   []byte
	Floor int64
}

// ReplayableMarkers reads up to limit batch markers; more reports that
// there are others. A batch that commits after a compaction to C was
// requested reads nothing older than C (its requests are checked against
// it), so once the compactor sees that request every marker with a floor
// below C is already stored.
func ReplayableMarkers(tx storage.ReadTx, limit int) (ms []Marker, more bool, err error) {
	begin, end := keyspace.BatchAll()
	kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: limit + 1})
	if err != nil {
		return nil, false, err
	}
	if len(kvs) > limit {
		kvs, more = kvs[:limit], true
	}
	for _, kv := range kvs {
		_, _, floor, err := decodeMarker(kv.Value)
		if err != nil {
			return nil, false, err
		}
		ms = append(ms, Marker{Key: kv.Key, Floor: floor})
	}
	return ms, more, nil
}

// ClearMarker removes a marker that nothing can replay any more: one seen
// at least ReplayWindow ago, since every attempt of a batch happens within
// its writer's CommitTimeout.
func ClearMarker(tx storage.Tx, key []byte) { tx.Clear(key) }
