package lease

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// BenchmarkRenewConcurrent is 16 and 256 clients' keep-alives, each of its
// own lease, back to back, with and without shared reads gathering the
// callers of the previous one (Config.Gather): every one is covered by the
// stored deadline, so it is answered from a read. It reports the process's
// CPU per keep-alive, the FoundationDB client's network thread included.
func BenchmarkRenewConcurrent(b *testing.B) {
	for _, clients := range []int{16, 256} {
		for _, gather := range []time.Duration{-1, 0} {
			name := fmt.Sprintf("clients=%d/gather=%v", clients, map[bool]string{true: "off", false: "on"}[gather < 0])
			b.Run(name, func(b *testing.B) { benchmarkRenewConcurrent(b, clients, gather) })
		}
	}
}

func benchmarkRenewConcurrent(b *testing.B, clients int, gather time.Duration) {
	db := testdb.Open(b)
	store, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	own := owner.Start(db, owner.Config{})
	l := New(store, own, Config{Gather: gather})
	b.Cleanup(func() {
		l.Stop()
		own.Stop()
		store.Close()
	})
	ids := make([]int64, clients)
	for i := range ids {
		g, err := l.Grant(context.Background(), 0, 300)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = g.ID
	}
	var next atomic.Int64
	cpu := processCPU(b)
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := ids[next.Add(1)%int64(clients)]
		for pb.Next() {
			if _, _, err := l.Renew(context.Background(), id); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is the CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
