//go:build fdb

package fdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"
	"github.com/apple/foundationdb/bindings/go/src/fdb/tuple"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Defaults and limits.
const (
	// DefaultAPIVersion is the FoundationDB API version the backend is written
	// against (FoundationDB 7.3).
	DefaultAPIVersion = 730
	// DefaultMaxRetries bounds the retries of one Update, View or WaitChange.
	// With FoundationDB's backoff (10 ms doubling to 1 s) that is well over a
	// minute of conflicts; the context usually ends a retry loop first.
	DefaultMaxRetries = 100
	// MaxPrefixBytes bounds the encoded keyspace prefix (see KeyPrefix).
	MaxPrefixBytes = 1024
	// closeGrace is how long Close lets transactions in flight finish before
	// it cancels them. Longer than a transaction can live.
	closeGrace = 2 * storage.MaxTransactionAge
)

// maxKeySize is the longest key the backend takes from its caller:
// storage.MaxKeySize and the room a nested keyspace's prefix needs.
const maxKeySize = storage.MaxKeySize + storage.MaxNestingBytes

// clientKeySizeLimit is the value of FoundationDB's client knob
// key_size_limit: room for the prefix, the caller's maxKeySize bytes, and
// the one extra byte a clipped range bound can have.
const clientKeySizeLimit = MaxPrefixBytes + maxKeySize + 1

// clientGRVBatchKnob sets FoundationDB's client knob grv_batch_timeout to
// 0. The client holds each read version request back to batch it with
// others, for a moving average of half the recent reply latency (at most
// that knob, 5 ms by default). A DB already batches its read version
// requests and keeps one in flight (versions.go), so the client's batch
// always holds one request and the wait was pure latency on every read
// version; and since it grows after slow replies, it lengthened exactly
// the tail. With 0 the client still batches what is queued at once.
const clientGRVBatchKnob = "grv_batch_timeout=0"

// maxWatches is the database option max_watches: how many FoundationDB
// watches the process may have outstanding on one cluster, all keyspaces
// together (every DB of a cluster file shares one database handle).
// FoundationDB's default is 10,000, which a replica serving a few thousand
// tenants passes (each running tenant waits on its live marker, its alarms
// and, when busy, its head and its lease expiry); past it a watch fails
// with too_many_watches, which no retry cures. This is the client's
// ceiling; a wait past it polls (Options.WatchPollInterval).
const maxWatches = 1_000_000

// Options configure Open.
type Options struct {
	// ClusterFile is the FoundationDB cluster file; "" means FoundationDB's
	// default (FDB_CLUSTER_FILE, else /etc/foundationdb/fdb.cluster).
	ClusterFile string
	// Prefix names the keyspace; see KeyPrefix.
	Prefix string
	// APIVersion is the client API version; 0 means DefaultAPIVersion. It can
	// be chosen once per process: every Open in a process must agree.
	APIVersion int
	// MaxRetries bounds the retries of one call; 0 means DefaultMaxRetries.
	MaxRetries int
	// ClientBuggify turns on FoundationDB's client-side fault injection.
	// A testing aid: never for production. Like APIVersion it is chosen
	// once per process, by the first Open.
	ClientBuggify ClientBuggify
	// Now is the clock that times read versions and commits and ages
	// reused read versions; nil means time.Now.
	Now func() time.Time
	// RecentVersionAge is how old a read version a storage.Recent View
	// may reuse; 0 means DefaultRecentVersionAge, a negative value turns
	// reuse off.
	RecentVersionAge time.Duration
	// WriteVersionAge is how old a read version the first attempt of an
	// Update may reuse; 0 means DefaultWriteVersionAge, a negative value
	// turns reuse off.
	WriteVersionAge time.Duration
	// WatchPollInterval is how long a WaitChange that FoundationDB refused
	// a watch (too_many_watches: every watch the client allows is in use)
	// waits before it reads its key again and asks for a watch again; 0
	// means DefaultWatchPollInterval.
	WatchPollInterval time.Duration
}

// DefaultWatchPollInterval is FoundationDB's own polling interval for a
// watch that a storage server sheds under memory pressure (the client
// knob WATCH_POLLING_TIME): a refused wait degrades the same way.
const DefaultWatchPollInterval = time.Second

// KeyPrefix returns the raw FoundationDB key prefix of the keyspace named
// name: its tuple-layer encoding, 0x02, name with 0x00 escaped as 0x00 0xff,
// then 0x00.
func KeyPrefix(name string) []byte {
	return tuple.Tuple{name}.Pack()
}

// DB is the FoundationDB backend.
type DB struct {
	db          fdbgo.Database
	clusterFile string
	prefix      []byte
	prefixEnd   []byte
	maxRetries  int
	now         func() time.Time
	recentAge   time.Duration
	writeAge    time.Duration
	watchPoll   time.Duration

	observer atomic.Pointer[observerBox]
	versions versionWatch
	sharing  versionSharing
	latest   latestKnown
	wakes    wakeRegistry
	txs      txPool
	shares   readShares

	// Every call is bracketed by enter/leave so that Close can wait for the
	// calls in flight and fail the ones that start after it.
	lifeMu   sync.Mutex
	isClosed bool
	inflight sync.WaitGroup

	closeOnce sync.Once
	// closing is canceled when Close starts: WaitChange returns at once and
	// Update and View stop retrying.
	closing     context.Context
	closingStop context.CancelFunc
	// abort is canceled closeGrace later: transactions still running are
	// canceled.
	abort     context.Context
	abortStop context.CancelFunc

	// commitHook, when set (by tests), is consulted after each successful
	// commit of Update; an error it returns is handled as the commit's result.
	commitHook func() error
}

var (
	_ storage.DB         = (*DB)(nil)
	_ storage.Sizer      = (*DB)(nil)
	_ storage.RangeSizer = (*DB)(nil)
)

// Open connects to the cluster in o.ClusterFile and returns the keyspace
// o.Prefix. It does not wait for the cluster to be reachable: transactions
// wait for it (bounded by their contexts).
func Open(o Options) (*DB, error) {
	if o.APIVersion == 0 {
		o.APIVersion = DefaultAPIVersion
	}
	if o.MaxRetries <= 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	prefix := KeyPrefix(o.Prefix)
	if len(prefix) > MaxPrefixBytes {
		return nil, fmt.Errorf("storage/fdb: prefix %q encodes to %d bytes, more than %d", o.Prefix, len(prefix), MaxPrefixBytes)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RecentVersionAge == 0 {
		o.RecentVersionAge = DefaultRecentVersionAge
	}
	if o.WriteVersionAge == 0 {
		o.WriteVersionAge = DefaultWriteVersionAge
	}
	if o.WatchPollInterval <= 0 {
		o.WatchPollInterval = DefaultWatchPollInterval
	}
	db, err := acquire(o.ClusterFile, o.APIVersion, o.ClientBuggify)
	if err != nil {
		return nil, err
	}
	d := &DB{
		db:          db,
		clusterFile: o.ClusterFile,
		prefix:      prefix,
		prefixEnd:   storage.Strinc(prefix),
		maxRetries:  o.MaxRetries,
		now:         o.Now,
		recentAge:   o.RecentVersionAge,
		writeAge:    o.WriteVersionAge,
		watchPoll:   o.WatchPollInterval,
	}
	d.observer.Store(&observerBox{nopObserver{}})
	d.closing, d.closingStop = context.WithCancel(context.Background())
	d.abort, d.abortStop = context.WithCancel(context.Background())
	return d, nil
}

// Prefix returns the raw key prefix of the keyspace (a copy).
func (d *DB) Prefix() []byte { return bytes.Clone(d.prefix) }

type observerBox struct{ Observer }

// SetObserver makes o receive the client measurements of the transactions
// that start from now on; nil stops them.
func (d *DB) SetObserver(o Observer) {
	if o == nil {
		o = nopObserver{}
	}
	d.observer.Store(&observerBox{o})
}

func (d *DB) observe() Observer { return d.observer.Load().Observer }

// --- process-wide client state ------------------------------------------------

// The FoundationDB client is process-wide: the API version can be selected
// once, network options must be set before the network starts, and the
// bindings cache one Database per cluster file (their cache is not safe for
// concurrent use). All of it goes through netMu; Databases are shared by
// reference count and closed when the last keyspace on them closes.
var (
	netMu      sync.Mutex
	netVersion int
	netBuggify ClientBuggify
	shared     = map[string]*sharedDB{}
)

type sharedDB struct {
	db   fdbgo.Database
	refs int
}

func acquire(clusterFile string, version int, buggify ClientBuggify) (fdbgo.Database, error) {
	netMu.Lock()
	defer netMu.Unlock()
	if netVersion == 0 {
		if err := fdbgo.APIVersion(version); err != nil {
			if v, verr := fdbgo.GetAPIVersion(); verr == nil && v != version {
				return fdbgo.Database{}, fmt.Errorf("storage/fdb: FoundationDB API version %d was already selected in this process; cannot use %d", v, version)
			}
			return fdbgo.Database{}, fmt.Errorf("storage/fdb: select FoundationDB API version %d: %w", version, err)
		}
		// Must precede the first database (which starts the network).
		if err := fdbgo.Options().SetKnob(fmt.Sprintf("key_size_limit=%d", clientKeySizeLimit)); err != nil {
			return fdbgo.Database{}, fmt.Errorf("storage/fdb: raise the client key size limit: %w", err)
		}
		if err := fdbgo.Options().SetKnob(clientGRVBatchKnob); err != nil {
			return fdbgo.Database{}, fmt.Errorf("storage/fdb: turn off the client's read version batching delay: %w", err)
		}
		if err := setBuggify(buggify); err != nil {
			return fdbgo.Database{}, err
		}
		netVersion, netBuggify = version, buggify
	} else if version != netVersion {
		return fdbgo.Database{}, fmt.Errorf("storage/fdb: FoundationDB API version %d was already selected in this process; cannot use %d", netVersion, version)
	} else if buggify != netBuggify {
		return fdbgo.Database{}, fmt.Errorf("storage/fdb: client buggify %+v was already chosen in this process; cannot use %+v", netBuggify, buggify)
	}
	if s, ok := shared[clusterFile]; ok {
		s.refs++
		return s.db, nil
	}
	db, err := fdbgo.OpenDatabase(clusterFile)
	if err != nil {
		return fdbgo.Database{}, fmt.Errorf("storage/fdb: open cluster file %q: %w", clusterFile, err)
	}
	if err := db.Options().SetMaxWatches(maxWatches); err != nil {
		return fdbgo.Database{}, fmt.Errorf("storage/fdb: raise the watch limit to %d: %w", maxWatches, err)
	}
	shared[clusterFile] = &sharedDB{db: db, refs: 1}
	return db, nil
}

// StopNetwork stops the process's FoundationDB client network thread and
// waits for it to end. A process that used FoundationDB calls it last, just
// before it exits: while that thread runs, the C++ runtime's exit handlers
// can corrupt the heap it is using and abort the exit
// (apple/foundationdb#3015). No DB can be opened in the process afterwards.
// It does nothing when no DB was ever opened.
func StopNetwork() error {
	netMu.Lock()
	defer netMu.Unlock()
	if netVersion == 0 {
		return nil
	}
	err := fdbgo.StopNetwork()
	if errors.Is(err, fdbgo.ErrNetworkNotStarted) || errors.Is(err, fdbgo.ErrNetworkAlreadyStopped) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage/fdb: stop the FoundationDB network: %w", err)
	}
	return nil
}

// setBuggify sets the client_buggify_* network options; like every network
// option they must precede the network's start.
func setBuggify(b ClientBuggify) error {
	if !b.Enable {
		return nil
	}
	for _, p := range []int{b.SectionActivatedPercent, b.SectionFiredPercent} {
		if p < 0 || p > 100 {
			return fmt.Errorf("storage/fdb: client buggify probability %d%% is not between 0 and 100", p)
		}
	}
	o := fdbgo.Options()
	if err := o.SetClientBuggifyEnable(); err != nil {
		return fmt.Errorf("storage/fdb: client_buggify_enable: %w", err)
	}
	if p := b.SectionActivatedPercent; p > 0 {
		if err := o.SetClientBuggifySectionActivatedProbability(int64(p)); err != nil {
			return fmt.Errorf("storage/fdb: client_buggify_section_activated_probability: %w", err)
		}
	}
	if p := b.SectionFiredPercent; p > 0 {
		if err := o.SetClientBuggifySectionFiredProbability(int64(p)); err != nil {
			return fmt.Errorf("storage/fdb: client_buggify_section_fired_probability: %w", err)
		}
	}
	return nil
}

func release(clusterFile string) {
	netMu.Lock()
	defer netMu.Unlock()
	s, ok := shared[clusterFile]
	if !ok {
		return
	}
	if s.refs--; s.refs == 0 {
		delete(shared, clusterFile)
		s.db.Close()
	}
}

// --- errors -------------------------------------------------------------------

// fdbError is a FoundationDB error with its storage meaning: errors.Is matches
// the storage sentinel (when there is one) and errors.As finds fdbgo.Error.
type fdbError struct {
	fe   fdbgo.Error
	kind error // a storage sentinel, or nil
}

func (e *fdbError) Error() string {
	if e.kind == nil {
		return "storage/fdb: " + e.fe.Error()
	}
	return e.kind.Error() + ": " + e.fe.Error()
}

func (e *fdbError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.fe}
	}
	return []error{e.kind, e.fe}
}

// FoundationDB error codes the backend treats specially.
const (
	codeTooOld         = 1007
	codeNotCommitted   = 1020
	codeCommitUnknown  = 1021
	codeTooManyWatches = 1032
	codeTxnTooLarge    = 2101
	codeKeyTooLarge    = 2102
	codeValueTooLarge  = 2103
)

var kinds = map[int]error{
	codeTooOld:        storage.ErrTransactionTooOld,
	codeNotCommitted:  storage.ErrNotCommitted,
	codeCommitUnknown: storage.ErrCommitUnknownResult,
	codeTxnTooLarge:   storage.ErrTransactionTooLarge,
	codeKeyTooLarge:   storage.ErrKeyTooLarge,
	codeValueTooLarge: storage.ErrValueTooLarge,
}

// mapError gives a FoundationDB error its storage meaning; other errors pass
// through.
func mapError(err error) error {
	if err == nil {
		return nil
	}
	var mapped *fdbError
	if errors.As(err, &mapped) {
		return err
	}
	var fe fdbgo.Error
	if !errors.As(err, &fe) {
		return err
	}
	return &fdbError{fe: fe, kind: kinds[fe.Code]}
}

// retryCode returns the FoundationDB error code to hand to OnError for err:
// the code of a FoundationDB error in its chain, or the code matching a
// retryable storage sentinel the transaction function returned itself.
func retryCode(err error) (int, bool) {
	var fe fdbgo.Error
	switch {
	case errors.As(err, &fe):
		return fe.Code, true
	case errors.Is(err, storage.ErrNotCommitted):
		return codeNotCommitted, true
	case errors.Is(err, storage.ErrTransactionTooOld):
		return codeTooOld, true
	case errors.Is(err, storage.ErrCommitUnknownResult):
		return codeCommitUnknown, true
	}
	return 0, false
}

// notCommitted reports whether a failed commit certainly did not apply.
func notCommitted(err error) bool {
	code, ok := retryCode(err)
	if !ok {
		return false
	}
	switch code {
	case codeNotCommitted, codeTooOld, codeTxnTooLarge, codeKeyTooLarge, codeValueTooLarge:
		return true
	}
	return false
}

// --- lifecycle ----------------------------------------------------------------

func (d *DB) enter(ctx context.Context) error {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if d.isClosed {
		return storage.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.inflight.Add(1)
	return nil
}

func (d *DB) leave() { d.inflight.Done() }

// Close stops the keyspace: calls that start later fail with ErrClosed,
// WaitChange calls return ErrClosed at once, and transactions in flight may
// finish their current attempt (they are canceled if they take longer than a
// transaction can live). A second Close returns ErrClosed.
func (d *DB) Close() error {
	err := storage.ErrClosed
	d.closeOnce.Do(func() {
		d.lifeMu.Lock()
		d.isClosed = true
		d.lifeMu.Unlock()
		d.closingStop()
		done := make(chan struct{})
		go func() {
			d.inflight.Wait()
			close(done)
		}()
		t := time.NewTimer(closeGrace)
		select {
		case <-done:
			t.Stop()
		case <-t.C:
			d.abortStop()
			<-done
		}
		d.abortStop()
		d.sharing.fetchers.Wait() // its read version request canceled
		d.shares.waiters.Wait()   // their shared transactions canceled
		release(d.clusterFile)
		err = nil
	})
	return err
}

// stopped returns the error to end a call with once ctx has ended or abort
// (Close) has, or nil.
func stopped(ctx, abort context.Context) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case abort.Err() != nil:
		return storage.ErrClosed
	}
	return nil
}

// unknownIf adds storage.ErrCommitUnknownResult to err when an attempt may
// have committed (its commit was reported unknown or cut off) and no later
// attempt settled it.
func unknownIf(uncertain bool, err error) error {
	if !uncertain || errors.Is(err, storage.ErrCommitUnknownResult) {
		return err
	}
	return fmt.Errorf("%w (%w: an earlier attempt may have committed)", err, storage.ErrCommitUnknownResult)
}

// run is the retry loop shared by Update, View and Size. attempt runs one try
// on tr and reports whether it got as far as committing; reuseAge is how
// old a version its first attempt may read at instead of a fresh one (0:
// none), and attempt learns the version it reads at and whether it was
// reused.
func (d *DB) run(ctx context.Context, reuseAge time.Duration, attempt func(tr fdbgo.Transaction, v attemptAt) (committing bool, err error)) error {
	if err := d.enter(ctx); err != nil {
		return err
	}
	defer d.leave()
	tr, err := d.txs.take(d.db)
	if err != nil {
		return mapError(err)
	}
	// Canceling the transaction ends whatever it waits for (a read, the
	// commit, OnError's backoff) with transaction_cancelled.
	defer d.txs.cancelOn(tr, ctx, d.abort)()
	uncertain := false
	for retries := 0; ; retries++ {
		if err := stopped(ctx, d.closing); err != nil {
			return unknownIf(uncertain, err)
		}
		if retries > 0 {
			reuseAge = 0
		}
		committing := false
		at, err := d.attemptVersion(ctx, tr, reuseAge)
		if err != nil {
			if stop := stopped(ctx, d.abort); stop != nil {
				return unknownIf(uncertain, stop)
			}
		} else {
			committing, err = attempt(tr, at)
		}
		if err == nil {
			return nil // a function that found its marker settles an unknown commit
		}
		code, ok := retryCode(err)
		if !ok {
			return err // the function's own error
		}
		if committing && !notCommitted(err) {
			uncertain = true
		}
		if stop := stopped(ctx, d.abort); stop != nil {
			return unknownIf(uncertain, stop)
		}
		if retries >= d.maxRetries {
			return unknownIf(uncertain, fmt.Errorf("storage/fdb: giving up after %d retries: %w", retries, mapError(err)))
		}
		if oerr := tr.OnError(fdbgo.Error{Code: code}).Get(); oerr != nil {
			if stop := stopped(ctx, d.abort); stop != nil {
				return unknownIf(uncertain, stop)
			}
			var fe fdbgo.Error
			if errors.As(oerr, &fe) && fe.Code == code {
				return unknownIf(uncertain, mapError(err)) // not retryable
			}
			return unknownIf(uncertain, mapError(oerr))
		}
		d.observe().ObserveFDBRetry(code, mapError(err))
	}
}

// --- Update and View ------------------------------------------------------------

// Update runs fn in a read-write transaction and commits it, retrying as the
// package documentation describes.
//
// When ctx says storage.Recent, its first attempt reads at the newest
// version this DB has seen if that was the latest at most WriteVersionAge
// ago (usually its own previous commit), saving a read version round trip:
// a transaction that writes is checked at commit against everything
// committed after the version it read at, so an older one costs at worst a
// conflict and a retry. A transaction that wrote nothing would not be
// checked, so it commits a write conflict range and no mutation: the
// resolvers check its reads like any other's, and what its caller learns
// is linearizable.
func (d *DB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	var reuseAge time.Duration
	if storage.FreshnessOf(ctx) == storage.Recent {
		reuseAge = max(d.writeAge, 0)
	}
	var unsure writeLog // the writes of attempts that may have committed
	return d.run(ctx, reuseAge, func(tr fdbgo.Transaction, v attemptAt) (bool, error) {
		t := &tx{d: d, tr: tr, r: tr}
		if err := fn(t); err != nil {
			return false, err
		}
		if t.err != nil {
			return false, t.err
		}
		if v.reused && t.writes.empty() {
			// No keyspace key is empty: nothing reads this one but a range
			// from the keyspace's start.
			if err := tr.AddWriteConflictKey(fdbgo.Key(d.key(nil))); err != nil {
				return false, mapError(err)
			}
		}
		start := d.now()
		err := tr.Commit().Get()
		d.observe().ObserveFDBCommit(d.now().Sub(start), err)
		if err != nil {
			if !notCommitted(err) {
				unsure.merge(&t.writes)
			}
			return true, mapError(err)
		}
		if cv, err := tr.GetCommittedVersion(); err == nil && cv > 0 {
			// Recent Views read this commit (a read-only one has no version).
			d.latest.saw(cv, start)
		}
		if d.commitHook != nil {
			if err := d.commitHook(); err != nil {
				unsure.merge(&t.writes)
				return true, mapError(err)
			}
		}
		d.wakes.wake(&unsure, &t.writes)
		return false, nil
	})
}

// View runs fn in a read-only transaction (snapshot reads, never
// committed). Its first attempt reads on the transaction the Views of its
// read version share (sharedread.go); one that ends in a FoundationDB error
// is retried on a transaction of its own, at a fresh version.
func (d *DB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	var reuseAge time.Duration
	if storage.FreshnessOf(ctx) == storage.Recent {
		reuseAge = max(d.recentAge, 0)
	}
	version := func() (attemptAt, error) { return d.readVersion(ctx, reuseAge) }
	return d.view(ctx, version, fn)
}

// view is View with the version of its first attempt from version.
func (d *DB) view(ctx context.Context, version func() (attemptAt, error), fn func(storage.ReadTx) error) error {
	if err := d.enter(ctx); err != nil {
		return err
	}
	defer d.leave()
	err := d.viewShared(ctx, version, fn)
	if err == nil {
		return nil
	}
	if stop := stopped(ctx, d.abort); stop != nil {
		return stop
	}
	code, ok := retryCode(err)
	if !ok {
		return err // fn's own error
	}
	d.observe().ObserveFDBRetry(code, mapError(err))
	return d.run(ctx, 0, func(tr fdbgo.Transaction, v attemptAt) (bool, error) {
		return false, fn(&tx{d: d, tr: tr, r: tr.Snapshot(), snapshot: v.v})
	})
}

// viewShared runs fn once on the shared transaction of its read version.
func (d *DB) viewShared(ctx context.Context, version func() (attemptAt, error), fn func(storage.ReadTx) error) error {
	if err := stopped(ctx, d.closing); err != nil {
		return err
	}
	at, err := version()
	if err != nil {
		return err
	}
	share, err := d.shares.join(d, at.v)
	if err != nil {
		return err
	}
	defer d.shares.leave(share)
	return fn(&tx{d: d, r: share.tr.Snapshot(), snapshot: at.v, share: share, ctx: ctx})
}

// exactSizeBelow is where Size stops adding up key and value bytes and
// trusts FoundationDB's sampled estimate, which reports 0 for small
// keyspaces: etcd clients read a zero dbSize as an empty or broken member.
const exactSizeBelow = 4 << 20

// Size estimates the bytes the keyspace occupies: FoundationDB's sampled
// estimate, or the exact sum of key and value bytes for a keyspace smaller
// than exactSizeBelow.
func (d *DB) Size() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	err := d.run(ctx, 0, func(tr fdbgo.Transaction, _ attemptAt) (bool, error) {
		kr := fdbgo.KeyRange{Begin: fdbgo.Key(d.prefix), End: fdbgo.Key(d.prefixEnd)}
		est, err := tr.GetEstimatedRangeSizeBytes(kr).Get()
		if err != nil {
			return false, mapError(err)
		}
		n = est
		if est >= exactSizeBelow {
			return false, nil
		}
		var sum int64
		it := tr.Snapshot().GetRange(kr, fdbgo.RangeOptions{Mode: fdbgo.StreamingModeIterator}).Iterator()
		for sum < exactSizeBelow && it.Advance() {
			kv, err := it.Get()
			if err != nil {
				return false, mapError(err)
			}
			sum += int64(len(kv.Key) - len(d.prefix) + len(kv.Value))
		}
		n = max(est, sum)
		return false, nil
	})
	return n, err
}

// RangeSize is FoundationDB's sampled estimate of the bytes in [begin, end)
// of this keyspace; it is 0 for ranges too small to be sampled.
func (d *DB) RangeSize(begin, end []byte) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	begin, end = clip(begin), clip(end)
	var n int64
	err := d.run(ctx, 0, func(tr fdbgo.Transaction, _ attemptAt) (bool, error) {
		kr := fdbgo.KeyRange{Begin: fdbgo.Key(d.key(begin)), End: fdbgo.Key(d.key(end))}
		est, err := tr.GetEstimatedRangeSizeBytes(kr).Get()
		if err != nil {
			return false, mapError(err)
		}
		n = est
		return false, nil
	})
	return n, err
}

// --- transactions ---------------------------------------------------------------

// key returns the FoundationDB key of a storage key.
func (d *DB) key(k []byte) []byte {
	out := make([]byte, len(d.prefix)+len(k))
	copy(out, d.prefix)
	copy(out[len(d.prefix):], k)
	return out
}

// clip shortens a range bound to maxKeySize+1 bytes, which selects the
// same stored keys (none is longer than maxKeySize).
func clip(b []byte) []byte {
	if len(b) > maxKeySize+1 {
		return b[:maxKeySize+1]
	}
	return b
}

type tx struct {
	d  *DB
	tr fdbgo.Transaction     // writes
	r  fdbgo.ReadTransaction // reads: tr, or tr.Snapshot() in a View
	// err is the first write refused by this backend (a key over
	// maxKeySize). Like FoundationDB's deferred errors it fails the
	// reads that follow and the commit.
	err error
	// writes is what the transaction wrote, for the WaitChange calls a
	// commit wakes; while empty the commit would not reach the cluster,
	// which is what checks the reads for conflicts.
	writes writeLog
	// snapshot is a View's read version (storage.Snapshotter), 0 in an
	// Update.
	snapshot int64
	// share is the shared transaction a View reads on (nil on one of its
	// own), ctx the View's request, and gone set once the View stopped
	// waiting for its reads (tx.await).
	share *readShare
	ctx   context.Context
	gone  atomic.Bool
}

// Snapshot names the snapshot a View reads: its read version. Reads at
// one version see one state of the database, and a fresh read version is
// above every version committed before it was requested.
func (t *tx) Snapshot() int64 { return t.snapshot }

func (t *tx) Get(key []byte) ([]byte, error) {
	if t.err != nil {
		return nil, t.err
	}
	if len(key) > maxKeySize {
		return nil, nil
	}
	f := t.r.Get(fdbgo.Key(t.d.key(key)))
	var v []byte
	var err error
	if werr := t.await(func() { v, err = f.Get() }, f.Cancel); werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, mapError(err)
	}
	return v, nil
}

// GetMany issues every read before waiting for any, so they run in parallel.
func (t *tx) GetMany(keys [][]byte) ([][]byte, error) {
	if t.err != nil {
		return nil, t.err
	}
	return t.waitAll(t.issue(keys))
}

// issue starts the point reads of keys; a key longer than maxKeySize has
// no future (no such key exists).
func (t *tx) issue(keys [][]byte) []fdbgo.FutureByteSlice {
	futures := make([]fdbgo.FutureByteSlice, len(keys))
	for i, k := range keys {
		if len(k) <= maxKeySize {
			futures[i] = t.r.Get(fdbgo.Key(t.d.key(k)))
		}
	}
	return futures
}

// waitAll waits for every future and returns their values, or for the
// View's end (tx.await), which cancels them.
func (t *tx) waitAll(futures []fdbgo.FutureByteSlice) ([][]byte, error) {
	var out [][]byte
	var err error
	cancel := func() {
		for _, f := range futures {
			if f != nil {
				f.Cancel()
			}
		}
	}
	if werr := t.await(func() { out, err = waitAll(futures) }, cancel); werr != nil {
		return nil, werr
	}
	return out, err
}

// waitAll waits for every future and returns their values.
func waitAll(futures []fdbgo.FutureByteSlice) ([][]byte, error) {
	out := make([][]byte, len(futures))
	var first error
	for i, f := range futures {
		if f == nil {
			continue
		}
		v, err := f.Get()
		if err != nil && first == nil {
			first = err
		}
		out[i] = v
	}
	if first != nil {
		return nil, mapError(first)
	}
	return out, nil
}

// ReadBatch issues every read before waiting for any, so that they take
// one round trip: the points first, then the ranges, since the binding
// starts a range read only when it is waited for — the first on the
// caller's goroutine, each other on a goroutine of its own (a transaction
// is safe for concurrent use). A one-key Range reads one range, so it
// hands nothing to another goroutine. It returns once all are done.
func (t *tx) ReadBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	if t.err != nil {
		return nil, nil, t.err
	}
	futures := t.issue(keys)
	out := make([][]storage.KeyValue, len(ranges))
	errs := make([]error, len(ranges))
	var wg sync.WaitGroup
	for i := 1; i < len(ranges); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = t.GetRange(ranges[i].Begin, ranges[i].End, ranges[i].Opt)
		}()
	}
	if len(ranges) > 0 {
		out[0], errs[0] = t.GetRange(ranges[0].Begin, ranges[0].End, ranges[0].Opt)
	}
	vals, err := t.waitAll(futures)
	wg.Wait()
	if err != nil {
		return nil, nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return vals, out, nil
}

// GetRange reads a bounded page in one go (want-all) and an unbounded range
// with the iterator streaming mode, whose batches grow as the scan goes on.
func (t *tx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if t.err != nil {
		return nil, t.err
	}
	begin, end = clip(begin), clip(end)
	if bytes.Compare(begin, end) >= 0 {
		return nil, nil
	}
	r := fdbgo.KeyRange{Begin: fdbgo.Key(t.d.key(begin)), End: fdbgo.Key(t.d.key(end))}
	var kvs []fdbgo.KeyValue
	var err error
	if werr := t.await(func() { kvs, err = t.readRange(r, opt) }, nil); werr != nil {
		return nil, werr
	}
	if err != nil {
		return nil, mapError(err)
	}
	if len(kvs) == 0 {
		return nil, nil
	}
	n := len(t.d.prefix)
	out := make([]storage.KeyValue, len(kvs))
	for i, kv := range kvs {
		// Each key and value is its own copy out of the C library.
		out[i] = storage.KeyValue{Key: kv.Key[n:len(kv.Key):len(kv.Key)], Value: kv.Value}
		if out[i].Value == nil {
			out[i].Value = []byte{}
		}
	}
	return out, nil
}

// readRange reads r: a bounded page in one go, an unbounded range batch by
// batch until it ends or the View stopped waiting for it.
func (t *tx) readRange(r fdbgo.KeyRange, opt storage.RangeOptions) ([]fdbgo.KeyValue, error) {
	if opt.Limit > 0 {
		return t.r.GetRange(r, fdbgo.RangeOptions{Limit: opt.Limit, Mode: fdbgo.StreamingModeWantAll, Reverse: opt.Reverse}).GetSliceWithError()
	}
	var kvs []fdbgo.KeyValue
	it := t.r.GetRange(r, fdbgo.RangeOptions{Mode: fdbgo.StreamingModeIterator, Reverse: opt.Reverse}).Iterator()
	for !t.gone.Load() && it.Advance() {
		kv, err := it.Get()
		if err != nil {
			return nil, err
		}
		kvs = append(kvs, kv)
	}
	return kvs, nil
}

func (t *tx) Set(key, value []byte) {
	if len(key) > maxKeySize {
		if t.err == nil {
			t.err = &fdbError{
				fe:   fdbgo.Error{Code: codeKeyTooLarge},
				kind: fmt.Errorf("%w (set of a %d-byte key)", storage.ErrKeyTooLarge, len(key)),
			}
		}
		return
	}
	fk := t.d.key(key)
	t.writes.key(fk)
	t.tr.Set(fdbgo.Key(fk), value)
}

// Clear of a key longer than maxKeySize does nothing: no such key
// exists.
func (t *tx) Clear(key []byte) {
	if len(key) > maxKeySize {
		return
	}
	fk := t.d.key(key)
	t.writes.key(fk)
	t.tr.Clear(fdbgo.Key(fk))
}

func (t *tx) ClearRange(begin, end []byte) {
	begin, end = clip(begin), clip(end)
	if bytes.Compare(begin, end) >= 0 {
		return
	}
	fb, fe := t.d.key(begin), t.d.key(end)
	t.writes.clear(fb, fe)
	t.tr.ClearRange(fdbgo.KeyRange{Begin: fdbgo.Key(fb), End: fdbgo.Key(fe)})
}
