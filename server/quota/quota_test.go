package quota

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// countingSizer reports a settable size and counts the readings; while
// blocking, readings wait for release.
type countingSizer struct {
	size     atomic.Int64
	reads    atomic.Int64
	blocking atomic.Bool
	release  chan struct{}
}

func (s *countingSizer) Size() (int64, error) {
	s.reads.Add(1)
	if s.blocking.Load() {
		<-s.release
	}
	return s.size.Load(), nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// settle waits for the background reading to finish.
func settle(t *testing.T, q *Quota) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.reading.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the background reading never finished")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSizeReadAtMostOncePerRefresh: on FoundationDB a size reading is a
// storage round trip, so writes share one reading per interval.
func TestSizeReadAtMostOncePerRefresh(t *testing.T) {
	sz := &countingSizer{}
	sz.size.Store(100)
	clk := &clock{t: time.Unix(1000, 0)}
	q := New(Config{Bytes: 1000, Refresh: time.Second, Now: clk.now}, sz)
	defer q.Close()
	for range 100 {
		if !q.Available(500) {
			t.Fatal("refused within the quota")
		}
	}
	if n := sz.reads.Load(); n != 1 {
		t.Fatalf("%d readings for New and 100 requests within one interval, want 1", n)
	}
	sz.size.Store(600)
	clk.add(time.Second)
	if !q.Available(500) {
		t.Fatal("the request that starts a reading is measured against the previous one")
	}
	settle(t, q)
	if q.Available(500) {
		t.Fatal("600+500 >= 1000 admitted after the new reading")
	}
	if !q.Available(300) {
		t.Fatal("600+300 < 1000 refused")
	}
	if n := sz.reads.Load(); n != 2 {
		t.Fatalf("%d readings after the interval, want 2", n)
	}
	sz.size.Store(0)
	q.Refresh()
	if !q.Available(999) || q.Available(1000) {
		t.Fatal("etcd's check is size+cost < quota")
	}
}

// TestRequestsDoNotWaitForAReading: a slow reading (tens of milliseconds
// on a small FoundationDB keyspace) delays no write.
func TestRequestsDoNotWaitForAReading(t *testing.T) {
	sz := &countingSizer{release: make(chan struct{})}
	clk := &clock{t: time.Unix(1000, 0)}
	q := New(Config{Bytes: 1000, Refresh: time.Second, Now: clk.now}, sz)
	sz.blocking.Store(true)
	clk.add(time.Second)
	for range 10 {
		if !q.Available(10) {
			t.Fatal("refused while a reading is in progress")
		}
	}
	for deadline := time.Now().Add(10 * time.Second); sz.reads.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reading started after the interval")
		}
	}
	if !q.Available(10) || sz.reads.Load() != 2 {
		t.Fatalf("%d readings, want New's and the one in progress", sz.reads.Load())
	}
	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a reading was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	close(sz.release)
	<-closed
	clk.add(time.Second)
	q.Available(10)
	if n := sz.reads.Load(); n != 2 {
		t.Fatalf("a reading started after Close: %d readings", n)
	}
}

func TestQuotaDefaultsAsEtcd(t *testing.T) {
	if q := New(Config{}, nil); q.Bytes() != 2<<30 || !q.Enabled() {
		t.Fatalf("default quota %d", q.Bytes())
	}
	sz := &countingSizer{}
	sz.size.Store(1 << 40)
	if q := New(Config{Bytes: -1}, sz); q.Enabled() || !q.Available(1<<30) || q.Bytes() != -1 {
		t.Fatal("a negative quota must disable the check")
	}
	if q := New(Config{Bytes: -1}, sz); q.Available(1) && sz.reads.Load() != 0 {
		t.Fatal("a disabled quota reads the size")
	}
}

// TestLimitChangesARunningQuota: a Limit set while the quota runs is the
// quota of the next check and of Bytes (Status.dbSizeQuota); 0 is etcd's
// default and a negative value disables the check.
func TestLimitChangesARunningQuota(t *testing.T) {
	sz := &countingSizer{}
	sz.size.Store(1000)
	lim := NewLimit(-1)
	q := New(Config{Limit: lim, Refresh: time.Nanosecond}, sz)
	defer q.Close()
	if q.Enabled() || !q.Available(1<<40) {
		t.Fatal("a disabled limit checks")
	}
	lim.Set(2000)
	q.Refresh()
	if q.Bytes() != 2000 || q.Available(1000) || !q.Available(999) {
		t.Fatalf("after Set(2000): bytes %d, 1000 more fits %v", q.Bytes(), q.Available(1000))
	}
	lim.Set(0)
	if q.Bytes() != DefaultBytes || !q.Available(1000) {
		t.Fatalf("after Set(0): bytes %d", q.Bytes())
	}
}

// TestCostsAsEtcd pins etcd's cost formulas (server/storage/quota.go).
func TestCostsAsEtcd(t *testing.T) {
	put := &pb.PutRequest{Key: []byte("abc"), Value: make([]byte, 1000)}
	if c := PutCost(put); c != 256+3+1000 {
		t.Errorf("PutCost = %d", c)
	}
	op := func(p *pb.PutRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: p}}
	}
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	nested := &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Failure: []*pb.RequestOp{op(put), op(put)}}}}
	for _, c := range []struct {
		txn  *pb.TxnRequest
		want int
	}{
		{&pb.TxnRequest{Success: []*pb.RequestOp{get}}, 0},
		{&pb.TxnRequest{Success: []*pb.RequestOp{op(put)}, Failure: []*pb.RequestOp{get}}, 1259},
		{&pb.TxnRequest{Success: []*pb.RequestOp{get}, Failure: []*pb.RequestOp{op(put)}}, 1259},
		{&pb.TxnRequest{Success: []*pb.RequestOp{op(put)}, Failure: []*pb.RequestOp{nested}}, 2518},
	} {
		if got := TxnCost(c.txn); got != c.want {
			t.Errorf("TxnCost(%v) = %d, want %d", c.txn, got, c.want)
		}
	}
	if LeaseGrantCost != 64 {
		t.Errorf("LeaseGrantCost = %d", LeaseGrantCost)
	}
}

// BenchmarkAvailable is the quota check every Put, Txn and LeaseGrant pays
// between two size readings.
func BenchmarkAvailable(b *testing.B) {
	sz := &countingSizer{}
	sz.size.Store(1 << 20)
	q := New(Config{Bytes: DefaultBytes, Refresh: time.Hour}, sz)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !q.Available(300) {
				b.Error("refused")
				return
			}
		}
	})
}
