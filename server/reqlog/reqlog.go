// Package reqlog logs slow requests the way etcd does: one warning per unary
// request that took longer than --warning-apply-duration, with a summary of
// the request and the response. Fast requests are not logged at any level
// above debug.
package reqlog

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
)

// DefaultWarningApplyDuration is etcd's default threshold.
const DefaultWarningApplyDuration = 100 * time.Millisecond

// maxKey bounds how much of a key a log line shows.
const maxKey = 128

// UnaryServerInterceptor logs requests slower than threshold at warn level.
// A threshold of zero or less disables it.
func UnaryServerInterceptor(lg *zap.Logger, threshold time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		took := time.Since(start)
		if threshold <= 0 || took <= threshold {
			return resp, err
		}
		fields := []zap.Field{
			zap.String("method", info.FullMethod),
			zap.Duration("took", took),
			zap.Duration("expected-duration", threshold),
			zap.String("request", Request(req)),
		}
		if err != nil {
			st := errmap.Wire(err)
			fields = append(fields, zap.String("code", st.Code().String()), zap.String("error", st.Message()))
		} else {
			fields = append(fields, zap.String("response", Response(resp)))
		}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			fields = append(fields, zap.String("remote", p.Addr.String()))
		}
		lg.Warn("request took too long", fields...)
		return resp, err
	}
}

func quoteKey(k []byte) string {
	if len(k) > maxKey {
		return strconv.Quote(string(k[:maxKey])) + "..."
	}
	return strconv.Quote(string(k))
}

// Request summarises a request without its values: keys (truncated), sizes
// and options, in the spirit of etcd's "read-only range"/"put" log lines.
func Request(req any) string {
	var b strings.Builder
	switch r := req.(type) {
	case *pb.RangeRequest:
		writeRange(&b, r)
	case *pb.PutRequest:
		writePut(&b, r)
	case *pb.DeleteRangeRequest:
		writeDelete(&b, r)
	case *pb.TxnRequest:
		fmt.Fprintf(&b, "txn compare:%d success:%d failure:%d", len(r.Compare), len(r.Success), len(r.Failure))
		for i, c := range r.Compare {
			if i == 3 {
				b.WriteString(" ...")
				break
			}
			fmt.Fprintf(&b, " compare[%d]:{key:%s target:%s result:%s}", i, quoteKey(c.Key), c.Target, c.Result)
		}
		for i, op := range r.Success {
			if i == 3 {
				b.WriteString(" ...")
				break
			}
			fmt.Fprintf(&b, " success[%d]:{", i)
			writeOp(&b, op)
			b.WriteString("}")
		}
	case *pb.CompactionRequest:
		fmt.Fprintf(&b, "compact revision:%d physical:%v", r.Revision, r.Physical)
	case *pb.LeaseGrantRequest:
		fmt.Fprintf(&b, "lease-grant ttl:%d id:%d", r.TTL, r.ID)
	case *pb.LeaseRevokeRequest:
		fmt.Fprintf(&b, "lease-revoke id:%d", r.ID)
	case *pb.LeaseTimeToLiveRequest:
		fmt.Fprintf(&b, "lease-ttl id:%d keys:%v", r.ID, r.Keys)
	case proto.Message:
		fmt.Fprintf(&b, "%s size:%d", r.ProtoReflect().Descriptor().Name(), proto.Size(r))
	default:
		fmt.Fprintf(&b, "%T", req)
	}
	return b.String()
}

func writeOp(b *strings.Builder, op *pb.RequestOp) {
	switch {
	case op.GetRequestRange() != nil:
		writeRange(b, op.GetRequestRange())
	case op.GetRequestPut() != nil:
		writePut(b, op.GetRequestPut())
	case op.GetRequestDeleteRange() != nil:
		writeDelete(b, op.GetRequestDeleteRange())
	case op.GetRequestTxn() != nil:
		b.WriteString("txn")
	}
}

func writeRange(b *strings.Builder, r *pb.RangeRequest) {
	fmt.Fprintf(b, "range key:%s", quoteKey(r.Key))
	if len(r.RangeEnd) > 0 {
		fmt.Fprintf(b, " range_end:%s", quoteKey(r.RangeEnd))
	}
	if r.Limit != 0 {
		fmt.Fprintf(b, " limit:%d", r.Limit)
	}
	if r.Revision != 0 {
		fmt.Fprintf(b, " revision:%d", r.Revision)
	}
	if r.Serializable {
		b.WriteString(" serializable:true")
	}
	if r.CountOnly {
		b.WriteString(" count_only:true")
	}
	if r.KeysOnly {
		b.WriteString(" keys_only:true")
	}
}

func writePut(b *strings.Builder, r *pb.PutRequest) {
	fmt.Fprintf(b, "put key:%s value_size:%d", quoteKey(r.Key), len(r.Value))
	if r.Lease != 0 {
		fmt.Fprintf(b, " lease:%d", r.Lease)
	}
	if r.PrevKv {
		b.WriteString(" prev_kv:true")
	}
}

func writeDelete(b *strings.Builder, r *pb.DeleteRangeRequest) {
	fmt.Fprintf(b, "delete_range key:%s", quoteKey(r.Key))
	if len(r.RangeEnd) > 0 {
		fmt.Fprintf(b, " range_end:%s", quoteKey(r.RangeEnd))
	}
}

// Response summarises a response: revision, counts and size.
func Response(resp any) string {
	switch r := resp.(type) {
	case *pb.RangeResponse:
		return fmt.Sprintf("range_response_count:%d kvs:%d more:%v size:%d revision:%d",
			r.Count, len(r.Kvs), r.More, proto.Size(r), r.GetHeader().GetRevision())
	case *pb.PutResponse:
		return fmt.Sprintf("revision:%d", r.GetHeader().GetRevision())
	case *pb.DeleteRangeResponse:
		return fmt.Sprintf("deleted:%d revision:%d", r.Deleted, r.GetHeader().GetRevision())
	case *pb.TxnResponse:
		return fmt.Sprintf("succeeded:%v responses:%d size:%d revision:%d",
			r.Succeeded, len(r.Responses), proto.Size(r), r.GetHeader().GetRevision())
	case proto.Message:
		return fmt.Sprintf("size:%d", proto.Size(r))
	}
	return ""
}
