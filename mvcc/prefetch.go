package mvcc

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
)

// The keys a batch reads ahead (revision.Prefetcher): the compaction record
// Begin reads, and the index entry of every single key the batch's requests
// read first (a Put's previous version, a Txn's compares and single-key
// operations, a lease a Put attaches). Ranges are read as they are
// evaluated.

var (
	_ revision.Prefetcher = applier{}
	_ revision.Prefetcher = putRequest{}
	_ revision.Prefetcher = deleteRequest{}
	_ revision.Prefetcher = txnRequest{}
)

func (applier) Prefetch(keys [][]byte) [][]byte { return append(keys, keyspace.Compaction) }

func (p putRequest) Prefetch(keys [][]byte) [][]byte { return appendPut(keys, p.r) }

func (t txnRequest) Prefetch(keys [][]byte) [][]byte { return appendTxn(keys, t.r) }

func (d deleteRequest) Prefetch(keys [][]byte) [][]byte {
	if len(d.r.RangeEnd) == 0 {
		keys = append(keys, keyspace.Latest(d.r.Key))
	}
	return keys
}

func appendPut(keys [][]byte, r *pb.PutRequest) [][]byte {
	keys = append(keys, keyspace.Latest(r.Key))
	if r.Lease != 0 {
		keys = append(keys, keyspace.Lease(r.Lease))
	}
	return keys
}

// appendTxn adds the compares' keys and both branches' single-key
// operations: kube-apiserver's updates compare a key's mod revision, put it
// on success and get it on failure.
func appendTxn(keys [][]byte, r *pb.TxnRequest) [][]byte {
	for _, c := range r.Compare {
		if len(c.RangeEnd) == 0 {
			keys = append(keys, keyspace.Latest(c.Key))
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestPut:
				keys = appendPut(keys, o.RequestPut)
			case *pb.RequestOp_RequestRange:
				if len(o.RequestRange.RangeEnd) == 0 {
					keys = append(keys, keyspace.Latest(o.RequestRange.Key))
				}
			case *pb.RequestOp_RequestDeleteRange:
				if len(o.RequestDeleteRange.RangeEnd) == 0 {
					keys = append(keys, keyspace.Latest(o.RequestDeleteRange.Key))
				}
			}
		}
	}
	return keys
}

// ReadFloor implements revision.ReadFloorer: the oldest explicit revision
// the Txn's Ranges read at, nested Txns and both branches included, or 0.
func (t txnRequest) ReadFloor() int64 { return txnFloor(t.r) }

func txnFloor(r *pb.TxnRequest) int64 {
	var floor int64
	lower := func(rev int64) {
		if rev > 0 && (floor == 0 || rev < floor) {
			floor = rev
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				lower(o.RequestRange.Revision)
			case *pb.RequestOp_RequestTxn:
				lower(txnFloor(o.RequestTxn))
			}
		}
	}
	return floor
}
