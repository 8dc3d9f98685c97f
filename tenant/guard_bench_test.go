package tenant

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// BenchmarkGuardUnary is what the guard adds to each unary request of a
// tenant: the quotas in force, the request bucket and the tenant metrics.
func BenchmarkGuardUnary(b *testing.B) {
	for _, bc := range []struct {
		name string
		q    Quotas
	}{{"no-quota", Quotas{}}, {"rate", Quotas{RequestsPerSecond: 1e12, RequestBurst: 1 << 40}}} {
		b.Run(bc.name, func(b *testing.B) {
			g := newGuard("t", "t", newDB(nil, 1, bc.q, nil), newMetrics(DefaultMetricsLimit), time.Now, 0)
			info := &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Range"}
			resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 7}}
			handler := func(context.Context, any) (any, error) { return resp, nil }
			req := &pb.RangeRequest{Key: []byte("k")}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.unary(context.Background(), req, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkKeyQuotaPut is a Put that overwrites a key through a tenant's
// server: without a key quota, far from one (counted as new), and at one
// (looked up before it is admitted).
func BenchmarkKeyQuotaPut(b *testing.B) {
	for _, bc := range []struct {
		name string
		keys int64
	}{{"no-quota", 0}, {"far", 1 << 40}, {"at-quota", 100}} {
		b.Run(bc.name, func(b *testing.B) {
			e := startRouter(b, false)
			ctx := context.Background()
			if _, err := e.router.Registry().CreateWithQuotas(ctx, "t", Quotas{Keys: bc.keys}); err != nil {
				b.Fatal(err)
			}
			cli := e.client("t")
			for i := range 100 {
				if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i), "v"); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i%100), "v"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
