package revision

import (
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Marker is a batch marker as physical compaction sees it: a committed
// batch that a retry of its writer may still replay, reading the store as
// of Base. A writer clears its marker in its next batch, once nothing can
// replay it; what remains is each writer's newest batch, and the markers
// of writers that stopped.
type Marker struct {
	Key  []byte
	Base int64
}

// ReplayableMarkers reads up to limit batch markers; more reports that
// there are others. A batch that commits after the head passed revision R
// evaluated on a head at or above R, so once a compaction to C has been
// requested every marker with a base below C is already stored.
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
		base, _, err := decodeMarker(kv.Value)
		if err != nil {
			return nil, false, err
		}
		ms = append(ms, Marker{Key: kv.Key, Base: base})
	}
	return ms, more, nil
}

// ClearMarker removes a marker that nothing can replay any more: one seen
// at least ReplayWindow ago, since every attempt of a batch happens within
// its writer's CommitTimeout.
func ClearMarker(tx storage.Tx, key []byte) { tx.Clear(key) }
