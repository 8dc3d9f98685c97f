package mvcc

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// LeaseRemovedKey changes in every transaction that removes a lease record
// (a revoke, an expiry, a lease the mirrored etcd no longer has) or may
// move a record's deadline earlier (a mirrored lease written again).
// Nothing else does either: grants add records, and renewals and
// promotions only move deadlines later. So a reader that finds the key
// unchanged since it read a record knows the record still stands with at
// least the deadline it read, without reading it again; the lessor answers
// repeated keep-alives that way (lease/renewcache.go).
//
// The value is random, so that no two removals leave the same one; the key
// is only ever written blind, so it adds no read conflict to the
// transactions that change it.
var LeaseRemovedKey = keyspace.Singleton("lease/removed")

// MarkLeaseRemoved records in tx that a lease record is removed or its
// deadline may move earlier.
func MarkLeaseRemoved(tx storage.Tx) {
	tx.Set(LeaseRemovedKey, binary.BigEndian.AppendUint64(nil, rand.Uint64()))
}
