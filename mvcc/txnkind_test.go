package mvcc

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestTxnReadOnly pins etcd's rule (IsTxnReadonly): only top-level ops
// count, and a nested Txn is a write even when it only reads.
func TestTxnReadOnly(t *testing.T) {
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("k")}}}
	nested := func(ops ...*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: ops}}}
	}
	for _, tc := range []struct {
		name string
		r    *pb.TxnRequest
		want bool
	}{
		{"empty", &pb.TxnRequest{}, true},
		{"ranges", &pb.TxnRequest{Success: []*pb.RequestOp{rng, rng}, Failure: []*pb.RequestOp{rng}}, true},
		{"put", &pb.TxnRequest{Success: []*pb.RequestOp{rng, put}}, false},
		{"delete in failure", &pb.TxnRequest{Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{del}}, false},
		{"nested read-only txn", &pb.TxnRequest{Success: []*pb.RequestOp{nested(rng)}}, false},
		{"nested empty txn", &pb.TxnRequest{Failure: []*pb.RequestOp{nested()}}, false},
		{"empty op", &pb.TxnRequest{Success: []*pb.RequestOp{{}}}, false},
	} {
		if got := TxnReadOnly(tc.r); got != tc.want {
			t.Errorf("%s: TxnReadOnly = %t, want %t", tc.name, got, tc.want)
		}
	}
}
