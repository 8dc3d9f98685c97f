package revision

import (
	"fmt"
	"math"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// The checks below run only when invariants is set (race-enabled builds).
// A violation panics: it means revisions were handed out twice or with a
// gap, which no caller can recover from.

// checkNothingAbove: before a batch or a reservation takes revisions above
// head, nothing may be logged there yet.
func checkNothingAbove(tx storage.ReadTx, head int64) {
	kvs, err := tx.GetRange(keyspace.LogFrom(head+1), keyspace.LogFrom(math.MaxInt64), storage.RangeOptions{Limit: 1})
	if err != nil {
		return // the attempt fails on its own
	}
	if len(kvs) > 0 {
		rev, _, _ := keyspace.ParseLog(kvs[0].Key)
		panic(fmt.Sprintf("revision: revision %d is logged before the head (%d) reached it", rev, head))
	}
}

// checkLogged: a request that took rev wrote its log entry there, and
// nothing above it.
func checkLogged(tx storage.ReadTx, rev int64) {
	kvs, err := tx.GetRange(keyspace.LogFrom(rev), keyspace.LogFrom(math.MaxInt64), storage.RangeOptions{Limit: 1})
	if err != nil {
		return
	}
	if len(kvs) == 0 {
		panic(fmt.Sprintf("revision: a request took revision %d without logging it", rev))
	}
	if got, _, _ := keyspace.ParseLog(kvs[0].Key); got != rev {
		panic(fmt.Sprintf("revision: a request took revision %d and logged %d", rev, got))
	}
	checkNothingAbove(tx, rev)
}

// checkStaged: a staged request about to be published has logged revision
// base+1 if and only if it takes it, and nothing above.
func checkStaged(tx storage.ReadTx, base int64, wrote bool) {
	if wrote {
		checkLogged(tx, base+1)
		return
	}
	checkNothingAbove(tx, base)
}

// checkMonotonic: a writer's batches apply on a head no older than the one
// it last wrote, so no revision it hands out is handed out twice.
func (s *Sequencer[Resp]) checkMonotonic(base, newHead int64) {
	if base < s.lastHead {
		panic(fmt.Sprintf("revision: batch applied on head %d after this writer wrote head %d", base, s.lastHead))
	}
	s.lastHead = newHead
}
