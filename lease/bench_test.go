package lease

import (
	"context"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
)

// BenchmarkGrantConcurrent grants leases from many goroutines at once: each
// grant writes a lease record, so this measures the group commit of grants
// and renewals (how many share a transaction, and what queueing costs).
func BenchmarkGrantConcurrent(b *testing.B) {
	db := testdb.Open(b)
	store, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	own := owner.Start(db, owner.Config{})
	l := New(store, own, Config{})
	b.Cleanup(func() {
		l.Stop()
		own.Stop()
		store.Close()
	})
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Grant(context.Background(), 0, 60); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
