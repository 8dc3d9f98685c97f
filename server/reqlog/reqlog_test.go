package reqlog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/server/reqlog"
)

func TestRequestSummary(t *testing.T) {
	long := strings.Repeat("k", 500)
	for _, c := range []struct {
		req  any
		want string
	}{
		{&pb.RangeRequest{Key: []byte("/registry/pods/"), RangeEnd: []byte("/registry/pods0"), Limit: 500, CountOnly: true},
			`range key:"/registry/pods/" range_end:"/registry/pods0" limit:500 count_only:true`},
		{&pb.PutRequest{Key: []byte("a"), Value: []byte("secret"), Lease: 7},
			`put key:"a" value_size:6 lease:7`},
		{&pb.DeleteRangeRequest{Key: []byte("a")}, `delete_range key:"a"`},
		{&pb.TxnRequest{
			Compare: []*pb.Compare{{Key: []byte("a"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), Value: []byte("xy")}}}},
		}, `txn compare:1 success:1 failure:0 compare[0]:{key:"a" target:MOD result:EQUAL} success[0]:{put key:"a" value_size:2}`},
		{&pb.LeaseGrantRequest{TTL: 60}, "lease-grant ttl:60 id:0"},
		{&pb.RangeRequest{Key: []byte(long)}, `range key:"` + long[:128] + `"...`},
	} {
		if got := reqlog.Request(c.req); got != c.want {
			t.Errorf("Request(%T) = %s\nwant %s", c.req, got, c.want)
		}
	}
	if strings.Contains(reqlog.Request(&pb.PutRequest{Value: []byte("secret")}), "secret") {
		t.Fatal("a value was logged")
	}
}

func TestInterceptor(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	ic := reqlog.UnaryServerInterceptor(zap.New(core), 10*time.Millisecond)
	info := &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Range"}
	fast := func(context.Context, any) (any, error) { return &pb.RangeResponse{Count: 1}, nil }
	slow := func(context.Context, any) (any, error) {
		time.Sleep(20 * time.Millisecond)
		return nil, status.Error(codes.Unavailable, "storage unavailable")
	}
	_, _ = ic(context.Background(), &pb.RangeRequest{Key: []byte("a")}, info, fast)
	if logs.Len() != 0 {
		t.Fatalf("fast request logged: %v", logs.All())
	}
	_, _ = ic(context.Background(), &pb.RangeRequest{Key: []byte("a")}, info, slow)
	if logs.Len() != 1 {
		t.Fatalf("%d lines for a slow request", logs.Len())
	}
	e := logs.All()[0]
	f := e.ContextMap()
	if e.Level != zapcore.WarnLevel || f["code"] != "Unavailable" || f["request"] != `range key:"a"` {
		t.Fatalf("slow line: %v %v", e.Level, f)
	}
	off := reqlog.UnaryServerInterceptor(zap.New(core), -1)
	_, _ = off(context.Background(), &pb.RangeRequest{}, info, slow)
	if logs.Len() != 1 {
		t.Fatal("logged with the threshold disabled")
	}
}

// TestInterceptorLogsTheCodeClientsGet: a handler that returns its context's
// error (as the KV handlers do when a client gives up) is logged with the
// code gRPC sends the client, DeadlineExceeded, not Unknown.
func TestInterceptorLogsTheCodeClientsGet(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	ic := reqlog.UnaryServerInterceptor(zap.New(core), time.Millisecond)
	info := &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Put"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	late := func(ctx context.Context, _ any) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	_, _ = ic(ctx, &pb.PutRequest{Key: []byte("a")}, info, late)
	if logs.Len() != 1 {
		t.Fatalf("%d lines for a slow request", logs.Len())
	}
	if f := logs.All()[0].ContextMap(); f["code"] != "DeadlineExceeded" {
		t.Fatalf("logged code %v, want DeadlineExceeded (%v)", f["code"], f)
	}
}
