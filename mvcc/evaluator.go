package mvcc

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Evaluator evaluates etcd's KV requests against the data model: what the
// KV service calls. Store is the evaluator; the write forwarder and the
// alarm gate wrap one and pass on what they do not handle. It is declared
// here, below all of them, so that each names the same interface.
type Evaluator interface {
	Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	// RangeChunk is Range without the total count, for streamed chunks.
	RangeChunk(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error)
	DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error)
	Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error)
	Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error)
}

var _ Evaluator = (*Store)(nil)
