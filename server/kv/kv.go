// Package kv is etcd's KV service: each handler validates, calls the store,
// maps the error and fills the header — nothing else.
package kv

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Store is what the KV service needs from the data model.
type Store interface {
	Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error)
	DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error)
	Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error)
	Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error)
}

// Config holds etcd's request limits.
type Config struct {
	MaxTxnOps       int
	MaxRequestBytes int
}

// Server implements pb.KVServer.
type Server struct {
	pb.UnsafeKVServer
	store Store
	hdr   header.Filler
	cfg   Config
}

var _ pb.KVServer = (*Server)(nil)

// New returns the KV service.
func New(store Store, hdr header.Filler, cfg Config) *Server {
	return &Server{store: store, hdr: hdr, cfg: cfg}
}

// raftRequestSize is the size etcd checks against --max-request-bytes: the
// request wrapped in an InternalRaftRequest with a request header holding a
// 64-bit id (tag+len+id ≈ 13 bytes) and the request's own one-byte tag.
func raftRequestSize(m proto.Message) int {
	n := proto.Size(m)
	return 13 + 1 + protowire.SizeVarint(uint64(n)) + n
}

func (s *Server) checkSize(m proto.Message) error {
	if raftRequestSize(m) > s.cfg.MaxRequestBytes {
		return rpctypes.ErrGRPCRequestTooLarge
	}
	return nil
}

// Range reads keys.
func (s *Server) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := ValidateRange(r); err != nil {
		return nil, err
	}
	resp, err := s.store.Range(ctx, r)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	s.hdr.Fill(resp.Header)
	return resp, nil
}

// RangeStream is Range streamed in chunks (etcd 3.7): every chunk but the
// last carries only kvs; the last carries header, count and more.
func (s *Server) RangeStream(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	resp, err := s.Range(stream.Context(), r)
	if err != nil {
		return err
	}
	const chunkBytes = 1 << 20
	kvs := resp.Kvs
	for len(kvs) > 0 {
		n, size := 0, 0
		for n < len(kvs) && (n == 0 || size+proto.Size(kvs[n]) <= chunkBytes) {
			size += proto.Size(kvs[n])
			n++
		}
		if n == len(kvs) {
			break // the rest goes out with the final chunk
		}
		if err := stream.Send(&pb.RangeStreamResponse{RangeResponse: &pb.RangeResponse{Kvs: kvs[:n]}}); err != nil {
			return err
		}
		kvs = kvs[n:]
	}
	final := &pb.RangeResponse{Header: resp.Header, Kvs: kvs, More: resp.More, Count: resp.Count}
	return stream.Send(&pb.RangeStreamResponse{RangeResponse: final})
}

// Put writes a key.
func (s *Server) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := ValidatePut(r); err != nil {
		return nil, err
	}
	if err := s.checkSize(r); err != nil {
		return nil, err
	}
	resp, err := s.store.Put(ctx, r)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	s.hdr.Fill(resp.Header)
	return resp, nil
}

// DeleteRange deletes keys.
func (s *Server) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := ValidateDeleteRange(r); err != nil {
		return nil, err
	}
	if err := s.checkSize(r); err != nil {
		return nil, err
	}
	resp, err := s.store.DeleteRange(ctx, r)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	s.hdr.Fill(resp.Header)
	return resp, nil
}

// Txn runs a transaction.
func (s *Server) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := ValidateTxn(r, s.cfg.MaxTxnOps); err != nil {
		return nil, err
	}
	if !readOnly(r) {
		if err := s.checkSize(r); err != nil {
			return nil, err
		}
	}
	resp, err := s.store.Txn(ctx, r)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	s.hdr.Fill(resp.Header)
	return resp, nil
}

// Compact compacts the history.
func (s *Server) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	resp, err := s.store.Compact(ctx, r)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	s.hdr.Fill(resp.Header)
	return resp, nil
}

// readOnly is etcd's test for a Txn that skips consensus (and its size
// check): every top-level op is a Range.
func readOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}
