// Package lease is etcd's lessor over the storage interface: leases are
// granted, renewed and revoked in storage, so every fdb-etcd process sharing
// a store sees the same leases, and their deadlines survive restarts.
//
// Durability. A lease's deadline is stored with it. A keep-alive is
// acknowledged only once a deadline of at least now+TTL is durable: if the
// stored deadline already covers that, the keep-alive is answered from a read
// alone; otherwise it joins a group commit that writes now+TTL+slack (slack
// is min(RenewSlack, TTL/4)), so a client renewing back to back costs one
// write per slack period. The price is that a lease may outlive its last
// keep-alive by up to the slack. etcd instead keeps renewals in memory and
// resets every lease to its full TTL on restart or leader change; here a
// restart keeps the remaining TTL (kine #581).
//
// Expiry. Exactly one lessor expires leases at a time: the one in the
// process that owns writes (package owner), so that expiry revokes commit
// through the same sequencer as every forwarded write instead of
// conflicting with it. Each expiry is a mvcc revoke (all keys in one
// revision) whose fence re-reads the ownership record and the lease's
// deadline in the same transaction, so a deposed owner never deletes and a
// lease renewed at another process in the meantime survives. A new owner
// first extends every lease like etcd's Promote(extend): deadline' =
// max(deadline, now) + Extend, so no lease expires early because of a
// failover or restart. The owner's expiry timers come from a window of the
// deadline index (deadlines within ScanInterval) re-read at each wake; since
// ScanInterval <= MinTTL, a lease granted anywhere is seen before it is due.
// With no deadline in the window the owner sleeps until the earliest one,
// woken early by the wake key that every new or earlier deadline changes,
// so a keyspace without leases due soon costs no reads.
//
// Past its deadline a lease cannot be renewed, as with etcd's lessor: a
// keep-alive that finds it due waits until the owner's revoke commits and
// answers ErrLeaseNotFound (or, if a new owner's promotion extended it in
// the meantime, renews it), and a renewal's transaction refuses a deadline
// already past.
//
// Clocks. Deadlines are wall-clock instants written by the process that
// grants or renews and compared by the owner, so skew between processes
// moves expiry; docs/operations.md states the bound.
package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// MaxLeaseTTL is etcd's largest lease TTL, in seconds.
const MaxLeaseTTL = 9_000_000_000

// Domain errors; server/errmap maps them onto etcd's gRPC errors.
var (
	ErrLeaseExists      = errors.New("lease: lease already exists")
	ErrLeaseTTLTooLarge = errors.New("lease: too large lease TTL")
	// ErrLeaseNotFound is mvcc's, so a revoke and a lessor call fail alike.
	ErrLeaseNotFound = mvcc.ErrLeaseNotFound
	// ErrStopped is returned after Stop.
	ErrStopped = mvcc.ErrStopped
)

// Config tunes a Lessor. The zero value is etcd's defaults.
type Config struct {
	Logger *zap.Logger
	// Observer is told about grants, renewals, revocations, expiries and
	// ownership changes (the server's metrics); nil means nobody.
	Observer Observer
	// Clock defaults to the system clock.
	Clock clock.Clock
	// MinTTL is the smallest TTL granted, in seconds; shorter requests are
	// raised to it. etcd derives it from its election timeout: with the
	// default 100 ms heartbeat and 1 s election timeout it is 2.
	MinTTL int64
	// Extend is added to every lease's remaining time when a lessor becomes
	// the owner (etcd's Promote(electionTimeout)); default 1 s.
	Extend time.Duration
	// ScanInterval bounds the time between two reads of the deadline index
	// by the owner while a deadline is that close; it is capped at MinTTL.
	// Default 1 s.
	ScanInterval time.Duration
	// QuietScanInterval bounds it while none is: the owner then sleeps
	// until the earliest deadline and wakes early when a deadline that may
	// be earlier is written (the wake key), so a tenant without leases
	// reads nothing in between. The bound only matters for grants by
	// processes that do not write the wake key (an older version, during
	// a rolling upgrade): their leases expire up to this late. Default
	// 10 s; never below ScanInterval.
	QuietScanInterval time.Duration
	// RenewSlack is how far beyond now+TTL a keep-alive writes the deadline,
	// so that back-to-back keep-alives are answered from a read; capped at
	// TTL/4 per lease. Default 1 s; negative means none.
	RenewSlack time.Duration
	// WriteBatch bounds the grants and renewals in one group commit, and
	// the keep-alives that share one read of their records.
	WriteBatch int
	// Gather is the longest a group commit or a shared read waits for the
	// callers of the previous one to come back (groupcommit's
	// Limits.Gather, on the real clock: it is about when clients' next
	// requests arrive, not about lease time); 0 means 1 ms, negative never
	// waits.
	Gather time.Duration
	// ExpireBatch bounds the leases one expiry pass handles before it
	// re-reads the index; ExpireConcurrency the revokes in flight.
	ExpireBatch       int
	ExpireConcurrency int
	// PromotePage bounds the leases one promotion transaction extends.
	PromotePage int
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.MinTTL <= 0 {
		c.MinTTL = 2
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Extend <= 0 {
		c.Extend = time.Second
	}
	if c.ScanInterval <= 0 {
		c.ScanInterval = time.Second
	}
	c.ScanInterval = min(c.ScanInterval, ttlDuration(c.MinTTL))
	if c.QuietScanInterval <= 0 {
		c.QuietScanInterval = 10 * time.Second
	}
	c.QuietScanInterval = max(c.QuietScanInterval, c.ScanInterval)
	if c.RenewSlack == 0 {
		c.RenewSlack = time.Second
	}
	if c.RenewSlack < 0 {
		c.RenewSlack = 0
	}
	if c.WriteBatch <= 0 {
		c.WriteBatch = 1024
	}
	if c.Gather == 0 {
		c.Gather = time.Millisecond
	}
	if c.ExpireBatch <= 0 {
		c.ExpireBatch = 1000
	}
	if c.ExpireConcurrency <= 0 {
		c.ExpireConcurrency = 32
	}
	if c.PromotePage <= 0 {
		c.PromotePage = 1000
	}
}

// Revoker is what the lessor needs from the data model: the database its
// records live in, and revocation of a lease with its keys in one revision.
type Revoker interface {
	DB() storage.DB
	Revoke(ctx context.Context, r *mvcc.RevokeRequest) (*pb.LeaseRevokeResponse, error)
}

// Lessor grants, renews, revokes and expires leases.
type Lessor struct {
	cfg   Config
	lg    *zap.Logger
	clock clock.Clock
	store Revoker
	db    storage.DB
	owner *owner.Elector

	writes   *groupcommit.Queue[*writeReq, writeRes] // grants and renewals
	reads    *groupcommit.Queue[int64, recordRead]   // keep-alives' reads of their records
	stop     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	mu  sync.Mutex
	own ownState // guarded by mu; the run loop alone writes it

	// Only the run loop uses these. wake: its wait for the wake key, kept
	// between quiet sleeps (nil when none); watchFailed: a wait for the
	// wake key failed and was logged.
	wake        *wakeWait
	watchFailed bool
}

type ownState struct {
	owned    bool
	epoch    uint64
	promoted bool   // the epoch's promotion finished
	cursor   []byte // the promotion's next lease record
}

// New starts a lessor on store that expires leases while own says this
// process is the owner. Stop it before stopping own and closing the store.
func New(store Revoker, own *owner.Elector, cfg Config) *Lessor {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lessor{
		cfg: cfg, lg: cfg.Logger, clock: cfg.Clock, store: store, db: store.DB(), owner: own,
		writes: groupcommit.New[*writeReq, writeRes](groupcommit.Limits{MaxBatch: cfg.WriteBatch, Gather: cfg.Gather}, ErrStopped),
		reads:  newReadQueue(cfg.WriteBatch, cfg.Gather),
		stop:   make(chan struct{}),
		ctx:    ctx, cancel: cancel,
	}
	l.wg.Add(1)
	go l.run()
	return l
}

// Stop ends expiry and fails further calls with ErrStopped; handing
// ownership over is the elector's Stop.
func (l *Lessor) Stop() {
	l.stopOnce.Do(func() {
		close(l.stop)
		l.cancel()
		l.writes.Stop()
		l.reads.Stop()
		l.wg.Wait()
	})
}

// Owner reports whether this lessor currently expires leases, and its epoch.
func (l *Lessor) Owner() (bool, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.own.owned && l.own.promoted, l.own.epoch
}

func (l *Lessor) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// Granted is a granted lease.
type Granted struct {
	ID  int64
	TTL int64
	// Revision is the current revision when the grant committed.
	Revision int64
}

// Observer receives lease lifecycle events.
type Observer interface {
	LeaseGranted()
	LeaseRenewed()
	LeaseRevoked()
	LeaseExpired(n int)
	SetLeaseOwner(owner bool)
}

type nopObserver struct{}

func (nopObserver) LeaseGranted()      {}
func (nopObserver) LeaseRenewed()      {}
func (nopObserver) LeaseRevoked()      {}
func (nopObserver) LeaseExpired(int)   {}
func (nopObserver) SetLeaseOwner(bool) {}

// Grant grants a lease with the given ID, or a generated one if id is 0.
func (l *Lessor) Grant(ctx context.Context, id, ttl int64) (Granted, error) {
	if ttl > MaxLeaseTTL {
		return Granted{}, ErrLeaseTTLTooLarge
	}
	ttl = max(ttl, l.cfg.MinTTL)
	for attempt := 0; ; attempt++ {
		gid := id
		if gid == 0 {
			gid = rand.Int64N(1<<63-1) + 1 // positive, like etcd's
		}
		res, err := l.submit(ctx, &writeReq{grant: true, id: gid, ttl: ttl, nonce: rand.Uint64() | 1})
		if errors.Is(err, ErrLeaseExists) && id == 0 && attempt < 10 {
			continue
		}
		if err != nil {
			return Granted{}, err
		}
		l.cfg.Observer.LeaseGranted()
		return Granted{ID: gid, TTL: ttl, Revision: res.rev}, nil
	}
}

// Revoke deletes the lease and all its keys in one revision, and returns the
// revision after it.
func (l *Lessor) Revoke(ctx context.Context, id int64) (int64, error) {
	if l.stopped() {
		return 0, ErrStopped
	}
	resp, err := l.store.Revoke(ctx, &mvcc.RevokeRequest{ID: id})
	if err != nil {
		return 0, err
	}
	l.cfg.Observer.LeaseRevoked()
	return resp.Header.Revision, nil
}

// Renew renews a lease for its TTL and returns the TTL and the revision read
// before the renewal; an unknown lease is ErrLeaseNotFound. A lease past its
// deadline is not renewed: as etcd's lessor does, Renew waits for the
// owner's revoke and then answers ErrLeaseNotFound, or renews the lease if
// a new owner's promotion extended it in the meantime.
func (l *Lessor) Renew(ctx context.Context, id int64) (ttl, rev int64, err error) {
	if l.stopped() {
		return 0, 0, ErrStopped
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	for {
		var raw []byte
		var rec record
		raw, rec, rev, err = l.readRecord(ctx, id)
		if err != nil {
			return 0, rev, l.stoppedOr(err)
		}
		now := l.clock.Now().UnixMicro()
		switch {
		case rec.Deadline <= now:
			err = l.db.WaitChange(ctx, keyspace.Lease(id), raw)
		case rec.Deadline >= addSat(now, ttlDuration(rec.TTL)):
			l.cfg.Observer.LeaseRenewed()
			return rec.TTL, rev, nil // a durable deadline already covers it
		default:
			var res writeRes
			if res, err = l.submit(ctx, &writeReq{id: id}); err == nil {
				l.cfg.Observer.LeaseRenewed()
				return res.ttl, rev, nil
			}
			if errors.Is(err, errExpired) {
				err = nil // due by the time it committed: wait as above
			}
		}
		if err != nil {
			return 0, rev, l.stoppedOr(err)
		}
	}
}

// readRecord reads lease id's stored record and the current revision, in
// a read shared with the concurrent keep-alives; an absent record is
// ErrLeaseNotFound.
func (l *Lessor) readRecord(ctx context.Context, id int64) (raw []byte, rec record, rev int64, err error) {
	r, err := l.readRecordShared(ctx, id)
	if err != nil {
		return nil, record{}, 0, err
	}
	if r.raw == nil {
		return nil, record{}, r.rev, ErrLeaseNotFound
	}
	rec, err = decodeRecord(r.raw)
	return r.raw, rec, r.rev, err
}

// stoppedOr is ErrStopped once Stop has begun (it cancels calls in
// flight), else err.
func (l *Lessor) stoppedOr(err error) error {
	if l.ctx.Err() != nil {
		return ErrStopped
	}
	return err
}

// Status is a lease's state as LeaseTimeToLive reports it.
type Status struct {
	ID         int64
	TTL        int64 // remaining seconds
	GrantedTTL int64
	Keys       [][]byte
	Revision   int64
}

// attachPage bounds the attachments read per transaction.
const attachPage = 10_000

// TimeToLive returns a lease's remaining TTL and, with keys, its keys; an
// unknown lease is ErrLeaseNotFound.
func (l *Lessor) TimeToLive(ctx context.Context, id int64, keys bool) (Status, error) {
	st := Status{ID: id}
	var rec record
	var found bool
	prefix := keyspace.AttachPrefix(id)
	end := storage.Strinc(prefix)
	var cursor []byte
	err := l.db.View(ctx, func(tx storage.ReadTx) error {
		st.Keys, cursor = nil, nil
		vals, err := tx.GetMany([][]byte{keyspace.Lease(id), keyspace.Head})
		if err != nil {
			return err
		}
		h, err := revision.DecodeHead(vals[1])
		if err != nil {
			return err
		}
		st.Revision, found = h.Rev, vals[0] != nil
		if !found {
			return nil
		}
		if rec, err = decodeRecord(vals[0]); err != nil {
			return err
		}
		if keys {
			st.Keys, cursor, err = readAttached(tx, prefix, end, len(prefix))
		}
		return err
	})
	for err == nil && cursor != nil {
		var page [][]byte
		var next []byte
		err = l.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			page, next, err = readAttached(tx, cursor, end, len(prefix))
			return err
		})
		st.Keys = append(st.Keys, page...)
		cursor = next
	}
	if err != nil {
		return Status{}, err
	}
	if !found {
		return Status{ID: id, Revision: st.Revision}, ErrLeaseNotFound
	}
	remaining := (rec.Deadline - l.clock.Now().UnixMicro()) / 1e6 // truncated, as etcd's
	st.TTL = min(max(remaining, 0), rec.TTL)
	st.GrantedTTL = rec.TTL
	return st, nil
}

// readAttached reads one page of attachments; next is nil after the last.
func readAttached(tx storage.ReadTx, from, end []byte, prefixLen int) (keys [][]byte, next []byte, err error) {
	kvs, err := tx.GetRange(from, end, storage.RangeOptions{Limit: attachPage})
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range kvs {
		keys = append(keys, kv.Key[prefixLen:])
	}
	if len(kvs) == attachPage {
		next = append(kvs[len(kvs)-1].Key, 0)
	}
	return keys, next, nil
}

// leasePage bounds the lease records read per transaction.
const leasePage = 10_000

// Leases lists every lease ID, soonest deadline first (etcd's order), and
// the current revision.
func (l *Lessor) Leases(ctx context.Context) ([]int64, int64, error) {
	var items []leaseItem
	var rev int64
	begin, end := keyspace.LeaseAll()
	for first := true; begin != nil; first = false {
		var p leasesPage
		err := l.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			p, err = readLeasesPage(tx, begin, end, first)
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		if first {
			rev = p.rev
		}
		items = append(items, p.items...)
		begin = p.next
	}
	slices.SortFunc(items, func(a, b leaseItem) int {
		return cmp.Or(cmp.Compare(a.deadline, b.deadline), cmp.Compare(a.id, b.id))
	})
	ids := make([]int64, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	return ids, rev, nil
}

type leaseItem struct {
	id       int64
	deadline int64
}

// leasesPage is one transaction's page of lease records.
type leasesPage struct {
	rev   int64 // the current revision, read with the first page
	items []leaseItem
	next  []byte // where the next page starts; nil after the last
}

func readLeasesPage(tx storage.ReadTx, begin, end []byte, first bool) (leasesPage, error) {
	var p leasesPage
	if first {
		h, err := revision.ReadHead(tx)
		if err != nil {
			return p, err
		}
		p.rev = h.Rev
	}
	kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: leasePage})
	if err != nil {
		return p, err
	}
	for _, kv := range kvs {
		id, err := keyspace.ParseLease(kv.Key)
		if err != nil {
			return p, err
		}
		rec, err := decodeRecord(kv.Value)
		if err != nil {
			return p, fmt.Errorf("lease %d: %w", id, err)
		}
		p.items = append(p.items, leaseItem{id, rec.Deadline})
	}
	if len(kvs) == leasePage {
		p.next = append(kvs[len(kvs)-1].Key, 0)
	}
	return p, nil
}
