package mvcc

import pb "go.etcd.io/etcd/api/v3/etcdserverpb"

// TxnReadOnly is etcd's test (IsTxnReadonly in its txn package) for a Txn
// that is served as a read: every top-level op of both branches is a Range.
// Any other op, a nested Txn included even if it only reads, makes the Txn a
// write: etcd sends it through consensus and its size limit, and so do the
// KV service, the forwarding to the write owner and this store's write path.
// It is the one such predicate; every caller asks it.
func TxnReadOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}
