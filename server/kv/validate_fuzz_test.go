package kv

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

func seedTxn() []byte {
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a")}}}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("c")}}}
	nested := &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{put}, Failure: []*pb.RequestOp{del}}}}
	b, _ := proto.Marshal(&pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("a")}}, Success: []*pb.RequestOp{nested, put}})
	return b
}

// FuzzValidate feeds arbitrary wire bytes to the request validators: they
// must never panic, and a request they accept must have non-empty keys.
func FuzzValidate(f *testing.F) {
	f.Add(seedTxn())
	b, _ := proto.Marshal(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte{0}, SortTarget: 3})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var txn pb.TxnRequest
		if proto.Unmarshal(data, &txn) == nil {
			if ValidateTxn(&txn, 128) == nil {
				for _, c := range txn.Compare {
					if len(c.Key) == 0 {
						t.Fatal("accepted a compare with an empty key")
					}
				}
			}
		}
		var r pb.RangeRequest
		if proto.Unmarshal(data, &r) == nil && ValidateRange(&r) == nil && len(r.Key) == 0 {
			t.Fatal("accepted a range with an empty key")
		}
		var p pb.PutRequest
		if proto.Unmarshal(data, &p) == nil && ValidatePut(&p) == nil {
			if len(p.Key) == 0 || (p.IgnoreValue && len(p.Value) > 0) || (p.IgnoreLease && p.Lease != 0) {
				t.Fatal("accepted an invalid put")
			}
		}
	})
}

func TestDuplicateKeyRules(t *testing.T) {
	put := func(k string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k)}}}
	}
	del := func(k, end string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
	}
	txn := func(then, els []*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: then, Failure: els}}}
	}
	cases := []struct {
		name string
		ops  []*pb.RequestOp
		dup  bool
	}{
		{"two puts", []*pb.RequestOp{put("a"), put("a")}, true},
		{"put and delete of it", []*pb.RequestOp{put("b"), del("a", "c")}, true},
		{"put outside deleted range", []*pb.RequestOp{put("c"), del("a", "c")}, false},
		{"same key in then and else", []*pb.RequestOp{txn([]*pb.RequestOp{put("a")}, []*pb.RequestOp{put("a")})}, false},
		{"nested and outer put", []*pb.RequestOp{txn([]*pb.RequestOp{put("a")}, nil), put("a")}, true},
		{"nested delete and outer put", []*pb.RequestOp{txn(nil, []*pb.RequestOp{del("a", "")}), put("a")}, true},
		{"from-key delete is not checked like etcd", []*pb.RequestOp{put("b"), del("a", "\x00")}, false},
	}
	for _, tc := range cases {
		err := ValidateTxn(&pb.TxnRequest{Success: tc.ops}, 128)
		if (err != nil) != tc.dup {
			t.Errorf("%s: err %v, want duplicate %v", tc.name, err, tc.dup)
		}
	}
}
