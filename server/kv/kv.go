// Package kv is etcd's KV service: each handler validates, calls the store,
// maps the error and fills the header — nothing else.
package kv

import (
	"bytes"
	"context"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Evaluator is what the KV service evaluates its requests with: the local
// mvcc store, or the write forwarder in front of it.
type Evaluator = mvcc.Evaluator

// Config holds etcd's request limits.
type Config struct {
	MaxTxnOps       int
	MaxRequestBytes int
}

// Server implements pb.KVServer.
type Server struct {
	pb.UnsafeKVServer
	store Evaluator
	hdr   header.Filler
	cfg   Config
}

var _ pb.KVServer = (*Server)(nil)

// New returns the KV service.
func New(store Evaluator, hdr header.Filler, cfg Config) *Server {
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

// RangeStream is etcd 3.7's streamed Range: chunks read one after another at
// the revision pinned by the first, growing or shrinking toward the request
// size limit; only the last chunk carries the header, more and the count.
func (s *Server) RangeStream(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	if err := validateRangeStream(r); err != nil {
		return err
	}
	if r.CountOnly {
		resp, err := s.store.Range(stream.Context(), r)
		if err != nil {
			return errmap.ToGRPC(err)
		}
		out := &pb.RangeResponse{Header: s.hdr.New(resp.Header.Revision), Count: resp.Count}
		return stream.Send(&pb.RangeStreamResponse{RangeResponse: out})
	}
	return s.streamChunks(r, stream)
}

// validateRangeStream refuses what a stream of chunks read in key order
// cannot answer: other sort orders and revision filters.
func validateRangeStream(r *pb.RangeRequest) error {
	if err := ValidateRange(r); err != nil {
		return err
	}
	if r.SortOrder != pb.RangeRequest_NONE && (r.SortTarget != pb.RangeRequest_KEY || r.SortOrder != pb.RangeRequest_ASCEND) {
		return status.Error(codes.Unimplemented, "RangeStream does not support custom sort orders")
	}
	if r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return status.Error(codes.Unimplemented, "RangeStream does not support revision filters")
	}
	return nil
}

// streamChunks sends r's keys in chunks read at the revision of the first,
// sized towards MaxRequestBytes; the last chunk carries the header, More
// and the count of the whole range.
func (s *Server) streamChunks(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	ctx := stream.Context()
	req := proto.Clone(r).(*pb.RangeRequest)
	total := r.Limit
	if total <= 0 {
		total = math.MaxInt64
	}
	req.Limit = min(initialStreamChunk, total)
	var sent, headerRev int64
	for {
		resp, err := s.store.RangeChunk(ctx, req)
		if err != nil {
			return errmap.ToGRPC(err)
		}
		if headerRev == 0 {
			headerRev = resp.Header.Revision
			if req.Revision <= 0 {
				req.Revision = headerRev
			}
		}
		sent += int64(len(resp.Kvs))
		var next []byte
		if resp.More {
			next = append(bytes.Clone(resp.Kvs[len(resp.Kvs)-1].Key), 0)
		}
		out := &pb.RangeResponse{Kvs: resp.Kvs}
		done := !resp.More || sent == total
		if done {
			out.Header, out.More, out.Count = s.hdr.New(headerRev), resp.More, sent
			if resp.More {
				rest, err := s.store.Range(ctx, &pb.RangeRequest{Key: next, RangeEnd: req.RangeEnd, Revision: req.Revision, CountOnly: true})
				if err != nil {
					return errmap.ToGRPC(err)
				}
				out.Count += rest.Count
			}
		}
		if err := stream.Send(&pb.RangeStreamResponse{RangeResponse: out}); err != nil {
			return err
		}
		if done {
			return nil
		}
		req.Key = next
		req.Limit = min(nextChunkLimit(req.Limit, proto.Size(resp), s.cfg.MaxRequestBytes), total-sent)
	}
}

// initialStreamChunk is the first chunk's limit, as in etcd.
const initialStreamChunk = 10

// nextChunkLimit doubles or halves the chunk limit when the last chunk was
// far from the target size, never below one key.
func nextChunkLimit(last int64, lastSize, target int) int64 {
	switch {
	case lastSize < target/2:
		last *= 2
	case lastSize > target*2:
		last /= 2
	}
	return max(last, 1)
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
	if !mvcc.TxnReadOnly(r) {
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
