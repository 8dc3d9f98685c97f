package mvcc

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
)

// maxPrefetch bounds the keys one batch reads ahead; a batch of many
// large Txns reads the rest as it evaluates them.
const maxPrefetch = 4096

// Prefetch implements revision.Prefetcher: the compaction record Begin
// reads, and the index entry of every single key the batch's requests read
// first (a Put's previous version, a Txn's compares and single-key
// operations, a lease a Put attaches). Ranges are read as they are
// evaluated.
func (s *Store) Prefetch(reqs []any) [][]byte {
	keys := [][]byte{keyspace.Compaction}
	for _, req := range reqs {
		switch r := req.(type) {
		case *pb.PutRequest:
			keys = appendPut(keys, r)
		case *pb.DeleteRangeRequest:
			if len(r.RangeEnd) == 0 {
				keys = append(keys, keyspace.Latest(r.Key))
			}
		case *pb.TxnRequest:
			keys = appendTxn(keys, r)
		}
		if len(keys) >= maxPrefetch {
			return keys[:maxPrefetch]
		}
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
