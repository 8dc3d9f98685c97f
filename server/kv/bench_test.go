package kv_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
)

// BenchmarkPut measures puts of distinct 256-byte values over real gRPC,
// with b.RunParallel's goroutines as concurrent clients (-cpu sets them).
func BenchmarkPut(b *testing.B) {
	s := testserver.Start(b, testserver.Options{})
	val := string(make([]byte, 256))
	var n atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Client.Put(context.Background(), fmt.Sprintf("/k/%d", n.Add(1)), val); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRangeOneKey measures linearizable single-key reads.
func BenchmarkRangeOneKey(b *testing.B) {
	s := testserver.Start(b, testserver.Options{})
	if _, err := s.Client.Put(context.Background(), "/k", "v"); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Client.Get(context.Background(), "/k", clientv3.WithLimit(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
