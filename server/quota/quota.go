// Package quota is etcd's backend space quota (--quota-backend-bytes) and
// the NOSPACE alarm: a write that would take the store past the quota is
// refused with "etcdserver: mvcc: database space exceeded" and raises the
// alarm; while any NOSPACE alarm is raised, writes that add data are refused
// until an operator frees space and disarms it. The CORRUPT alarm refuses
// every write, as in etcd.
//
// etcd checks in two places, and so does this package: the gRPC services
// check the quota before anything else (KV, Lease), and the layer below
// validation, where etcd applies requests, checks the alarms
// (CappedStore, CappedLessor).
package quota

import (
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// DefaultBytes is etcd's quota when --quota-backend-bytes is 0: 2 GiB.
const DefaultBytes int64 = 2 << 30

// DefaultRefresh is how often the store's size is read at most.
const DefaultRefresh = time.Second

// etcd's cost estimates (server/storage/quota.go).
const (
	leaseOverhead = 64
	kvOverhead    = 256
)

// Sizer reports the store's size (storage.Sizer).
type Sizer interface {
	Size() (int64, error)
}

// Config is the quota.
type Config struct {
	// Bytes is --quota-backend-bytes: 0 means DefaultBytes and a negative
	// value disables the quota, as in etcd.
	Bytes int64
	// Refresh is the longest a size reading is used before it is read again
	// (DefaultRefresh when 0).
	Refresh time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Limit, when set, replaces Bytes and is read at every check, so that
	// its holder can change the quota of a running server (package tenant
	// does, when a tenant's quota is set).
	Limit *Limit
}

// Limit is a quota its holder can change while the server runs; it reads
// as Config.Bytes does (0: DefaultBytes, negative: no quota).
type Limit struct{ n atomic.Int64 }

// NewLimit returns a limit of n bytes.
func NewLimit(n int64) *Limit {
	l := &Limit{}
	l.n.Store(n)
	return l
}

// Set changes the limit; the next check uses it.
func (l *Limit) Set(n int64) { l.n.Store(n) }

// Load returns the limit as configured.
func (l *Limit) Load() int64 { return l.n.Load() }

// Quota decides whether a request fits. Reading the store's size costs a
// storage round trip on FoundationDB (measured: 0.1-0.4 ms above 4 MiB, where
// it is FoundationDB's estimate, and up to tens of ms below, where the bytes
// are summed), so the size is cached: a request that finds the reading older
// than Config.Refresh starts a new one in the background and, like every
// other request, is measured against the cached value, so no write waits
// for a reading. What that costs in precision: until a reading lands, writes
// are admitted against the previous one, so the store can pass the quota by
// up to about one refresh interval's write volume before the alarm is raised
// (etcd measures before every write, and passes it by at most one request);
// FoundationDB's size is itself sampled (storage/fdb Size). Refresh reads
// synchronously where it matters: after defragmentation and when an alarm is
// disarmed.
type Quota struct {
	limit   *Limit
	sizer   Sizer // nil: the size is unknown and counts as 0
	refresh time.Duration
	now     func() time.Time

	size    atomic.Int64 // the latest reading
	readAt  atomic.Int64 // when size was read, in unix nanoseconds
	reading atomic.Bool  // a background reading is in progress

	mu      sync.Mutex
	closed  bool           // guarded by mu: Close was called; no more readings start
	readers sync.WaitGroup // the background reading, waited for by Close
}

// New returns the quota over sizer (which may be nil), with a first
// reading taken.
func New(cfg Config, sizer Sizer) *Quota {
	q := &Quota{limit: cfg.Limit, sizer: sizer, refresh: cfg.Refresh, now: cfg.Now}
	if q.limit == nil {
		q.limit = NewLimit(cfg.Bytes)
	}
	if q.refresh <= 0 {
		q.refresh = DefaultRefresh
	}
	if q.now == nil {
		q.now = time.Now
	}
	if q.Enabled() {
		q.read() // a Limit that enables it later has the first request start a reading
	}
	return q
}

// Bytes is the quota etcd reports in Status.dbSizeQuota: the configured
// value, DefaultBytes for 0.
func (q *Quota) Bytes() int64 {
	if n := q.limit.Load(); n != 0 {
		return n
	}
	return DefaultBytes
}

// Enabled reports whether requests are checked at all.
func (q *Quota) Enabled() bool { return q.Bytes() > 0 }

// Available is etcd's check: a request that adds data fits when the size
// plus its cost stays below the quota.
func (q *Quota) Available(cost int) bool {
	limit := q.Bytes()
	if cost == 0 || limit <= 0 {
		return true
	}
	return q.Size()+int64(cost) < limit
}

// Size returns the cached size, starting a new reading when it is older
// than the refresh interval and none is in progress. It returns the size
// cached before that reading started, which the reading may overtake.
func (q *Quota) Size() int64 {
	size := q.size.Load()
	if q.now().UnixNano()-q.readAt.Load() >= int64(q.refresh) && q.reading.CompareAndSwap(false, true) {
		q.startReading()
	}
	return size
}

func (q *Quota) startReading() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.readers.Add(1)
	go func() {
		defer q.readers.Done()
		defer q.reading.Store(false)
		q.read()
	}()
}

// Refresh reads the size now.
func (q *Quota) Refresh() { q.read() }

// Close waits for a background reading in progress; none starts after.
func (q *Quota) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.readers.Wait()
}

// read takes a reading; on error the previous one stays, and is trusted
// for another interval rather than retried by every request.
func (q *Quota) read() {
	if q.sizer != nil {
		if n, err := q.sizer.Size(); err == nil {
			q.size.Store(n)
		}
	}
	q.readAt.Store(q.now().UnixNano())
}

// PutCost is etcd's charge for a Put: its key and value and an overhead.
func PutCost(r *pb.PutRequest) int { return kvOverhead + len(r.Key) + len(r.Value) }

// TxnCost is etcd's charge for a Txn: its costlier branch, counting the
// puts of nested transactions; 0 for a Txn without puts.
func TxnCost(r *pb.TxnRequest) int {
	branch := func(ops []*pb.RequestOp) int {
		n := 0
		for _, op := range ops {
			switch {
			case op.GetRequestPut() != nil:
				n += PutCost(op.GetRequestPut())
			case op.GetRequestTxn() != nil:
				n += TxnCost(op.GetRequestTxn())
			}
		}
		return n
	}
	return max(branch(r.Success), branch(r.Failure))
}

// LeaseGrantCost is etcd's charge for a LeaseGrant.
const LeaseGrantCost = leaseOverhead
