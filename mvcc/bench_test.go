package mvcc_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// openBenchStore opens a store on Pebble in a temp dir, closed when b ends.
func openBenchStore(b *testing.B, o pebble.Options) *mvcc.Store {
	b.Helper()
	db, err := pebble.Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	s, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

// loadStore writes n keys with 2 KB values under /registry/pods/, on the
// backend FDB_ETCD_TEST_BACKEND names (Pebble without syncs by default).
func loadStore(b *testing.B, n int) *mvcc.Store {
	b.Helper()
	var s *mvcc.Store
	if testdb.Backend() == "pebble" {
		s = openBenchStore(b, pebble.Options{NoSync: true})
	} else {
		var err error
		if s, err = mvcc.Open(testdb.Open(b), mvcc.Config{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
	}
	val := make([]byte, 2048)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if _, err := s.Put(context.Background(), &pb.PutRequest{Key: []byte(fmt.Sprintf("/registry/pods/ns/%06d", i)), Value: val}); err != nil {
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	return s
}

func BenchmarkList50k(b *testing.B) {
	s := loadStore(b, 50_000)
	ctx := context.Background()
	req := &pb.RangeRequest{Key: []byte("/registry/pods/"), RangeEnd: []byte("/registry/pods0")}
	b.Run("unpaginated", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r, err := s.Range(ctx, req)
			if err != nil || len(r.Kvs) != 50_000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("pages-of-500", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			key, rev, got := req.Key, int64(0), 0
			for {
				r, err := s.Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: req.RangeEnd, Limit: 500, Revision: rev})
				if err != nil {
					b.Fatal(err)
				}
				rev = r.Header.Revision
				got += len(r.Kvs)
				if !r.More {
					break
				}
				key = append(append([]byte(nil), r.Kvs[len(r.Kvs)-1].Key...), 0)
			}
			if got != 50_000 {
				b.Fatalf("got %d", got)
			}
		}
	})
	// The first count of a range scans it; this is that cost.
	b.Run("count-only-uncached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			end := []byte(fmt.Sprintf("/registry/pods0%d", i)) // same keys, a range never counted before
			r, err := s.Range(ctx, &pb.RangeRequest{Key: req.Key, RangeEnd: end, CountOnly: true})
			if err != nil || r.Count != 50_000 {
				b.Fatal(err)
			}
		}
	})
	// Later counts catch up from the revision log: here 10 writes apart.
	b.Run("count-only-after-10-writes", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			for j := 0; j < 10; j++ {
				if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("/registry/pods/ns/%06d", j)), Value: []byte("v")}); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			r, err := s.Range(ctx, &pb.RangeRequest{Key: req.Key, RangeEnd: req.RangeEnd, CountOnly: true})
			if err != nil || r.Count != 50_000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("count-only", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			r, err := s.Range(ctx, &pb.RangeRequest{Key: req.Key, RangeEnd: req.RangeEnd, CountOnly: true})
			if err != nil || r.Count != 50_000 {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPutSerialDurable is one client's Put on a synced store: the write
// path under the gRPC layer, whose floor is one WAL fdatasync.
func BenchmarkPutSerialDurable(b *testing.B) {
	s := openBenchStore(b, pebble.Options{})
	val := make([]byte, 256)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("/k/%09d", i)), Value: val}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRangeBeforeLargeDelete reads 20,000 keys at the revision before
// a staged DeleteRange of them, which is what every read of them does
// while the delete is staged.
func BenchmarkRangeBeforeLargeDelete(b *testing.B) {
	s := openBenchStore(b, pebble.Options{NoSync: true})
	ctx := context.Background()
	for i := 0; i < 20_000; i += 500 {
		var ops []*pb.RequestOp
		for j := i; j < i+500; j++ {
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(fmt.Sprintf("d/%06d", j)), Value: []byte("v")}}})
		}
		if _, err := s.Txn(ctx, &pb.TxnRequest{Success: ops}); err != nil {
			b.Fatal(err)
		}
	}
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("d/"), RangeEnd: []byte("d0")})
	if err != nil {
		b.Fatal(err)
	}
	req := &pb.RangeRequest{Key: []byte("d/"), RangeEnd: []byte("d0"), Revision: d.Header.Revision - 1, KeysOnly: true}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, err := s.Range(ctx, req); err != nil || len(r.Kvs) != 20_000 {
			b.Fatalf("%d keys, %v", len(r.GetKvs()), err)
		}
	}
}

// BenchmarkRangeAfterWrites is an empty prefix Range (it reads the head
// and the compaction record, and finds no key) after 0, 5,000 and 20,000
// Puts on the embedded store, whose memtable then holds a version of the
// head per commit: the state's read must not step over them (a scan from
// the head to the compaction record did: 10 µs, 176 µs and 858 µs, against
// 10, 7.4 and 7.4 µs with point reads).
func BenchmarkRangeAfterWrites(b *testing.B) {
	for _, writes := range []int{0, 5_000, 20_000} {
		b.Run(fmt.Sprintf("writes=%d", writes), func(b *testing.B) {
			s := openBenchStore(b, pebble.Options{NoSync: true})
			ctx := context.Background()
			for i := range writes {
				if _, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "w/%d", i%100), Value: make([]byte, 64)}); err != nil {
					b.Fatal(err)
				}
			}
			req := &pb.RangeRequest{Key: []byte("x/"), RangeEnd: []byte("x0")}
			b.ResetTimer()
			for range b.N {
				if _, err := s.Range(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPutConcurrent is 16 and 256 clients' Puts of distinct keys on
// the store testdb gives (FoundationDB with FDB_ETCD_TEST_BACKEND=fdb): the
// group commit's throughput, with and without batches gathering the
// clients of the previous one (revision.Config.Gather). It reports the
// puts per batch.
func BenchmarkPutConcurrent(b *testing.B) {
	for _, clients := range []int{16, 256} {
		for _, gather := range []time.Duration{-1, 0} {
			name := fmt.Sprintf("clients=%d/gather=%v", clients, map[bool]string{true: "off", false: "on"}[gather < 0])
			b.Run(name, func(b *testing.B) { benchmarkPutConcurrent(b, clients, gather) })
		}
	}
}

func benchmarkPutConcurrent(b *testing.B, clients int, gather time.Duration) {
	var batches atomic.Int64
	cfg := mvcc.Config{Sequencer: revision.Config{Gather: gather, Observe: func(int, int, time.Duration) { batches.Add(1) }}}
	s, err := mvcc.Open(testdb.Open(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	val := make([]byte, 256)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(p *testing.PB) {
		for p.Next() {
			if _, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "/k/%09d", n.Add(1)), Value: val}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/float64(max(batches.Load(), 1)), "puts/batch")
}

// openTestStore opens a store on the database testdb gives, both closed
// when b ends.
func openTestStore(b *testing.B) (storage.DB, *mvcc.Store) {
	db := testdb.Open(b)
	s, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return db, s
}

// BenchmarkRangeConcurrent is 256 clients' 1-key Ranges, linearizable and
// serializable, on the store testdb gives (FoundationDB with
// FDB_ETCD_TEST_BACKEND=fdb): what a read costs when its read version is
// shared with the reads that arrived with it, or, serializable, reused
// from a few milliseconds before.
func BenchmarkRangeConcurrent(b *testing.B) {
	db, s := openTestStore(b)
	ctx := context.Background()
	for i := range 256 {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "/k/%03d", i), Value: make([]byte, 256)}); err != nil {
			b.Fatal(err)
		}
	}
	grvs := countReadVersions(db)
	for _, serializable := range []bool{false, true} {
		name := map[bool]string{false: "linearizable", true: "serializable"}[serializable]
		b.Run(name, func(b *testing.B) {
			grvs.Store(0)
			cpu := processCPU(b)
			defer func() {
				b.ReportMetric(float64(grvs.Load())/float64(b.N), "grv/op")
				b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			}()
			var n atomic.Int64
			b.SetParallelism(256 / runtime.GOMAXPROCS(0))
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					key := fmt.Appendf(nil, "/k/%03d", n.Add(1)%256)
					r, err := s.Range(ctx, &pb.RangeRequest{Key: key, Serializable: serializable})
					if err != nil || len(r.Kvs) != 1 {
						b.Errorf("range %s: %v, %v", key, r, err)
						return
					}
				}
			})
		})
	}
}

// processCPU is the CPU time this process has used, the FoundationDB
// client's network thread included: per operation it is the layer's cost,
// which the host's other load changes far less than it changes wall time.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// grvCounter counts FoundationDB read version requests.
type grvCounter struct{ atomic.Int64 }

func (*grvCounter) ObserveFDBRetry(int, error)            {}
func (*grvCounter) ObserveFDBCommit(time.Duration, error) {}
func (c *grvCounter) ObserveFDBReadVersion(time.Duration) { c.Add(1) }
func (*grvCounter) ObserveFDBRecovery()                   {}

// countReadVersions counts db's read version requests, if it is
// FoundationDB's (0 on other backends).
func countReadVersions(db storage.DB) *grvCounter {
	c := &grvCounter{}
	if o, ok := db.(interface{ SetObserver(fdb.Observer) }); ok {
		o.SetObserver(c)
	}
	return c
}

// BenchmarkRangeOneClient is one client's linearizable 1-key Ranges, one
// after another, on the store testdb gives: each waits for a read version
// of its own, so on FoundationDB it is the latency of a read version and
// one read, which kube-apiserver's current-revision read before a
// consistent LIST pays. Beside a reader, another goroutine reads all the
// while (as a replica's leases and watch hub do), so the client's Ranges
// often start while a read version request is already in flight. It
// reports the median and the 99th percentile.
func BenchmarkRangeOneClient(b *testing.B) {
	_, s := openTestStore(b)
	ctx := context.Background()
	key := []byte("/k")
	if _, err := s.Put(ctx, &pb.PutRequest{Key: key, Value: make([]byte, 256)}); err != nil {
		b.Fatal(err)
	}
	for _, beside := range []bool{false, true} {
		name := map[bool]string{false: "alone", true: "beside a reader"}[beside]
		b.Run(name, func(b *testing.B) {
			if beside {
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("/other")}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
				defer wg.Wait()
				defer close(stop)
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				r, err := s.Range(ctx, &pb.RangeRequest{Key: key})
				if err != nil || len(r.Kvs) != 1 {
					b.Fatalf("range: %v, %v", r, err)
				}
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}
