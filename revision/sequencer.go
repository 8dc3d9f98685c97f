// Package revision owns etcd's one global revision: it starts at 1 on a fresh
// store, every write request that changes something takes the next one, and
// nothing else moves it.
//
// Concurrent write requests are batched into one storage transaction (group
// commit): each request gets its own consecutive revision and the batch pays
// for one durable commit. Batches are idempotent under "commit unknown
// result": the transaction records a marker for the batch, and an attempt that
// finds its own marker knows the batch already landed and rebuilds every
// response from the store instead of applying anything twice.
//
// A request too large for one transaction is staged (staged.go): the next
// revision is reserved for it, its writes are staged in transactions of their
// own that readers do not see, and one small commit publishes them.
//
// No batch holds the sequencer longer than Config.CommitTimeout: a batch that
// cannot commit by then is answered ErrTimeout (its outcome unknown, as
// etcd's "request timed out"), one that is too large for a transaction is
// split, and a request too large on its own fails alone with ErrTooLarge.
package revision

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/internal/groupcommit"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// RequestID names one request of one batch; the applier records it with the
// revision the request took, so a replay can tell which requests wrote.
type RequestID struct {
	Writer uint64
	Seq    uint64
	Index  uint32
}

// Env is what a request's outcome depends on besides the keys: the
// compaction revision. An attempt reads it once (Applier.Begin); a
// compaction in the batch changes it for the requests after it; and the
// batch marker records its value at the batch's start, so that a replay after
// commit_unknown_result evaluates every request against exactly what the
// commit did, whatever has been compacted since.
type Env struct {
	Compacted int64
}

// Request is one write request, answered with a Resp. The layer above
// defines its requests and how they evaluate; the sequencer orders, batches,
// retries and replays them without looking inside. It never imports gRPC.
type Request[Resp any] interface {
	// Apply evaluates the request on top of the store at revision rev (the
	// newest revision visible in tx), writes its mutations to tx and reports
	// whether it took revision rev+1. A request-level failure (bad lease,
	// ...) is returned as reqErr and must leave tx untouched; ErrStage as
	// reqErr asks for the request to be staged (Stageable); err means the
	// storage failed and the whole batch is retried. A compaction updates
	// env. It may run any number of times, in attempts of different batches.
	Apply(tx storage.Tx, env *Env, rev int64, id RequestID) (resp Resp, wrote bool, reqErr, err error)
	// Replay rebuilds the response of a request that an earlier attempt of
	// the same batch already committed, reading the store as of rev (the
	// revision before the request) under env, exactly as Apply evaluated it.
	Replay(tx storage.ReadTx, env *Env, rev int64, id RequestID) (resp Resp, wrote bool, reqErr, err error)
}

// Applier is the store the requests apply to.
type Applier interface {
	// Begin reads the Env an attempt evaluates against.
	Begin(tx storage.ReadTx) (Env, error)
}

// Prefetcher is an optional capability of an Applier (the keys Begin will
// read) and of a Request (the keys its Apply will read first). An attempt
// reads them in the round trip that reads the head, so that the applier's
// own reads are answered from the transaction's read cache (FoundationDB's
// read-your-writes cache keeps every value a transaction has read): a batch
// of puts waits for one read round trip instead of one per request.
type Prefetcher interface {
	// Prefetch appends the keys to keys.
	Prefetch(keys [][]byte) [][]byte
}

// Decider is an optional capability of an Applier: told when each attempt
// of a batch has ended, whether the last run of it — the one that called
// Begin last — committed, and then the value it wrote to the head key (nil
// if it took no revision). A batch found committed by a replay
// (commit_unknown_result, errLanded) is reported as not committed by
// that run: what landed is what an earlier run wrote, which a later run
// may have evaluated differently. The store keeps the tail of the
// revision log in memory with it (mvcc's logTail).
type Decider interface {
	Decided(committed bool, head []byte)
}

// ReadFloorer is an optional capability of a Request: the oldest revision
// it reads at other than the revision it applies on (a Txn's Range at an
// explicit revision), or 0. A batch's marker records the lowest, so that
// physical compaction spares what its replay would read.
type ReadFloorer interface {
	ReadFloor() int64
}

// Config tunes the sequencer.
type Config struct {
	// MaxBatch bounds the requests in one batch.
	MaxBatch int
	// BatchBytes bounds the bytes one batch writes; a request that alone is
	// larger still runs in a batch of its own, up to the storage limit.
	BatchBytes int
	// CommitTimeout bounds how long one batch may retry before its requests
	// are answered ErrTimeout; 0 means storage.MaxTransactionAge. It also
	// bounds the time in which a batch can be replayed, which physical
	// compaction relies on (ReplayWindow).
	CommitTimeout time.Duration
	// BeatInterval is how often a writer staging a request shows progress;
	// BeatTimeout how long a waiter lets the beat stand still before it
	// finishes the staged request itself. 0 means 500 ms and 5 s.
	BeatInterval, BeatTimeout time.Duration
	// Now is the clock for durations; nil means time.Now.
	Now func() time.Time
	// Observe, when set, is told each committed batch's size and duration.
	Observe func(requests int, bytes int, took time.Duration)
	// Gather is the longest a batch waits for the requests of the previous
	// batch to come back (groupcommit's Limits.Gather: never more than
	// half a commit, and only right after one); 0 means 1 ms, negative
	// never waits. GatherClock is its clock; nil means the real one.
	Gather      time.Duration
	GatherClock clock.Clock
	// Yield, when set, is asked before a batch is retried (its previous
	// attempt failed, usually a conflict on the head revision); true gives
	// the batch up: its requests are answered ErrYielded, none of them
	// applied. A replica that commits writes itself while another owns
	// them (server/forward) yields once it can send them to that owner,
	// against whose stream of commits its retries would lose until their
	// deadline.
	Yield func() bool
}

func (c *Config) defaults() {
	if c.MaxBatch <= 0 {
		c.MaxBatch = 1024
	}
	if c.BatchBytes <= 0 {
		c.BatchBytes = 2 << 20
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = storage.MaxTransactionAge
	}
	if c.BeatInterval <= 0 {
		c.BeatInterval = 500 * time.Millisecond
	}
	if c.BeatTimeout <= 0 {
		c.BeatTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Gather == 0 {
		c.Gather = time.Millisecond
	}
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.defaults()
	return c
}

// ReplayWindow is how long after a compaction request commits a batch that
// evaluated under the previous compaction may still be replayed by a
// sequencer with this configuration: every attempt of a batch, replays
// included, happens within CommitTimeout of its first, and a batch that had
// not started when the compaction committed reads it. The second is margin
// for clocks that run at slightly different rates.
func (c Config) ReplayWindow() time.Duration {
	c.defaults()
	return c.CommitTimeout + time.Second
}

// Head is the decoded head key: the current revision and the batch that set it.
type Head struct {
	Rev    int64
	Writer uint64
	Seq    uint64
}

// DecodeHead decodes the head key's value; an absent head is revision 1.
func DecodeHead(v []byte) (Head, error) {
	if v == nil {
		return Head{Rev: 1}, nil
	}
	if len(v) != 24 {
		return Head{}, fmt.Errorf("revision: head value of %d bytes", len(v))
	}
	return Head{
		Rev:    int64(binary.BigEndian.Uint64(v)),
		Writer: binary.BigEndian.Uint64(v[8:]),
		Seq:    binary.BigEndian.Uint64(v[16:]),
	}, nil
}

// EncodeHead encodes a head key's value. Only the write path and a bulk
// load into an empty keyspace (mvcc.BulkLoader) write the head.
func EncodeHead(h Head) []byte { return encodeHead(h) }

func encodeHead(h Head) []byte {
	out := make([]byte, 0, 24)
	out = binary.BigEndian.AppendUint64(out, uint64(h.Rev))
	out = binary.BigEndian.AppendUint64(out, h.Writer)
	return binary.BigEndian.AppendUint64(out, h.Seq)
}

// ReadHead reads the current revision inside a transaction.
func ReadHead(tx storage.ReadTx) (Head, error) {
	v, err := tx.Get(keyspace.Head)
	if err != nil {
		return Head{}, err
	}
	return DecodeHead(v)
}

// Errors of the write path.
var (
	// ErrStopped is returned for requests submitted after Stop, and for
	// requests still waiting for another writer's staged request at Stop
	// (they were not applied).
	ErrStopped = errors.New("revision: sequencer stopped")
	// ErrTimeout: the request's batch did not commit within CommitTimeout.
	// It may or may not have been applied, as with etcd's "request timed out".
	ErrTimeout = errors.New("revision: request timed out")
	// ErrTooLarge: the request alone is more than one storage transaction
	// can write, and it cannot be staged. Nothing was applied.
	ErrTooLarge = errors.New("revision: request is too large")
	// ErrYielded: the request's batch was given up (Config.Yield) before
	// any attempt of it could commit. Nothing was applied.
	ErrYielded = errors.New("revision: batch yielded to another writer; not applied")
	// ErrStage is what Apply returns (as its reqErr) for a request it wants
	// staged: too large for a batch, and one the Stager can write in parts.
	ErrStage = errors.New("revision: request must be staged")
)

// Sequencer batches write requests into storage transactions.
//
// There is no sequencer goroutine: the requests queue in a
// groupcommit.Queue, where the caller that finds no batch in progress
// commits one itself and hands the lead to the oldest request still queued
// when it is done. A lone client thus commits on its own goroutine, without
// two goroutine hand-offs per write that cost a single client about a tenth
// of its puts.
type Sequencer[Resp any] struct {
	db     storage.DB
	app    Applier
	cfg    Config
	writer uint64
	q      *groupcommit.Queue[Request[Resp], Resp]
	// stop ends waits for other writers' staged requests at Stop; commits
	// and this writer's own staging run to their end, bounded by their
	// deadlines.
	stop     context.Context
	stopWait context.CancelFunc

	mu sync.Mutex
	// started and decided count batches; settled is closed and replaced
	// whenever one is decided (Settle). Guarded by mu.
	started, decided uint64
	settled          chan struct{}

	// Guarded by the lead, not by mu.
	seq uint64
	// staleMarkers is the seqs of this writer's batch markers that nothing
	// replays any more, which its next write clears: its newest batch's,
	// and those of staged requests and failed batches since (see
	// markStale). At most maxStaleMarkers.
	staleMarkers []uint64
	lastHead     int64 // the newest head this writer committed (invariants)
}

// pending is a request in the queue.
type pending[Resp any] = groupcommit.Waiter[Request[Resp], Resp]

// result is a request's outcome, as an attempt builds it.
type result[Resp any] struct {
	resp Resp
	err  error
}

// New returns a sequencer; Stop ends it. Each sequencer is a writer with a
// random identity, so batch markers of different processes never collide.
func New[Resp any](db storage.DB, app Applier, cfg Config) *Sequencer[Resp] {
	cfg.defaults()
	s := &Sequencer[Resp]{db: db, app: app, cfg: cfg, writer: rand.Uint64(), settled: make(chan struct{})}
	s.q = groupcommit.New[Request[Resp], Resp](groupcommit.Limits{MaxBatch: cfg.MaxBatch, MaxBytes: cfg.BatchBytes, Gather: cfg.Gather, Clock: cfg.GatherClock}, ErrStopped)
	s.stop, s.stopWait = context.WithCancel(context.Background())
	return s
}

// Do submits one write request and waits for its response. sizeHint is the
// request's encoded size, used to keep batches small. A request whose ctx
// ends while it is queued leaves the queue at once, answered with ctx's
// error and never applied; once a batch has taken it, it is decided whatever
// ctx does, which keeps "did it apply?" answerable for the caller's retry
// logic. When the caller leads a batch, ctx also bounds the leader's wait
// for another writer's staged write.
func (s *Sequencer[Resp]) Do(ctx context.Context, req Request[Resp], sizeHint int) (Resp, error) {
	return s.q.Do(ctx, req, sizeHint, func(batch []*pending[Resp]) { s.commit(ctx, batch) })
}

// Stop waits for the requests already queued to be decided; later ones get
// ErrStopped. It first ends the waits for other writers' staged requests,
// which could otherwise hold a batch, and Stop, for seconds.
func (s *Sequencer[Resp]) Stop() {
	s.stopWait()
	s.q.Stop()
}

// Settle returns once every batch that was being committed when it was
// called has been decided: none of them can be replayed any more. Physical
// compaction uses it so as never to remove history a replay of this
// writer's batches could read.
func (s *Sequencer[Resp]) Settle(ctx context.Context) error {
	s.mu.Lock()
	target := s.started
	for s.decided < target {
		ch := s.settled
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return nil
}

func (s *Sequencer[Resp]) batchStarted() {
	s.mu.Lock()
	s.started++
	s.mu.Unlock()
}

func (s *Sequencer[Resp]) batchDecided() {
	s.mu.Lock()
	s.decided++
	close(s.settled)
	s.settled = make(chan struct{})
	s.mu.Unlock()
}

// commit decides every request of batch, a prefix at a time, unless a
// staged write is in progress: then the batch goes back to the queue. Before
// each prefix it answers the requests whose ctx has ended: none of them is
// in a batch that committed, since an attempt that found its batch
// committed answers the whole prefix.
func (s *Sequencer[Resp]) commit(ctx context.Context, batch []*pending[Resp]) {
	for {
		batch = dropEnded(batch)
		if len(batch) == 0 {
			return
		}
		n, staged := s.commitPrefix(batch)
		if staged != nil {
			s.awaitQueued(ctx, batch, staged)
			return
		}
		batch = batch[n:]
	}
}

// awaitQueued puts batch back at the front of the queue, where its callers
// can give up (a staged write takes seconds), and waits, holding the lead,
// until the staged write recorded as rec is published or the leader's ctx
// ends; the next leader takes the batch again. If the wait fails, the
// requests of batch still queued are answered with its error.
func (s *Sequencer[Resp]) awaitQueued(ctx context.Context, batch []*pending[Resp], rec []byte) {
	s.q.Requeue(batch)
	err := s.awaitPending(ctx, rec)
	if err == nil || ctx.Err() != nil && !errors.Is(err, ErrStopped) {
		return
	}
	s.q.FailQueued(batch, s.classify(err))
}

// dropEnded answers the requests of batch whose ctx has ended, unapplied,
// and returns the others.
func dropEnded[Resp any](batch []*pending[Resp]) []*pending[Resp] {
	return slices.DeleteFunc(batch, func(p *pending[Resp]) bool {
		if err := p.Ctx.Err(); err != nil {
			var none Resp
			p.Answer(none, err)
			return true
		}
		return false
	})
}

// answer sends results to the first len(results) requests of batch.
func answer[Resp any](batch []*pending[Resp], results []result[Resp]) int {
	for i := range results {
		batch[i].Answer(results[i].resp, results[i].err)
	}
	return len(results)
}

// failAll answers the first n requests of batch with err.
func failAll[Resp any](batch []*pending[Resp], n int, err error) int {
	results := make([]result[Resp], n)
	for i := range results {
		results[i] = result[Resp]{err: err}
	}
	return answer(batch, results)
}
