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
	"sync"
	"time"

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

// Applier evaluates write requests. It never imports gRPC; requests and
// responses are whatever the applier defines.
type Applier interface {
	// Begin reads the Env an attempt evaluates against.
	Begin(tx storage.ReadTx) (Env, error)
	// Apply evaluates req on top of the store at revision rev (the newest
	// revision visible in tx), writes its mutations to tx and reports whether
	// it took revision rev+1. A request-level failure (bad lease, ...) is
	// returned as reqErr and must leave tx untouched; ErrStage as reqErr asks
	// for the request to be staged (Stager); err means the storage failed and
	// the whole batch is retried. A compaction updates env.
	Apply(tx storage.Tx, env *Env, rev int64, id RequestID, req any) (resp any, wrote bool, reqErr, err error)
	// Replay rebuilds the response of a request that an earlier attempt of the
	// same batch already committed, reading the store as of rev (the revision
	// before the request) under env, exactly as Apply evaluated it.
	Replay(tx storage.ReadTx, env *Env, rev int64, id RequestID, req any) (resp any, wrote bool, reqErr, err error)
}

// Prefetcher is an optional Applier capability: the keys Begin and Apply
// will read for a batch's requests. An attempt reads them in the round trip
// that reads the head, so that the applier's own reads are answered from
// the transaction's read cache (FoundationDB's read-your-writes cache keeps
// every value a transaction has read): a batch of puts waits for one read
// round trip instead of one per request.
type Prefetcher interface {
	Prefetch(reqs []any) [][]byte
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
	// ErrStage is what Apply returns (as its reqErr) for a request it wants
	// staged: too large for a batch, and one the Stager can write in parts.
	ErrStage = errors.New("revision: request must be staged")
)

// Sequencer batches write requests into storage transactions.
//
// There is no sequencer goroutine: requests queue in a groupcommit.Queue,
// whose caller that finds no batch in progress commits one itself. A lone
// client thus commits on its own goroutine, without two goroutine hand-offs
// per write that cost a single client about a tenth of its puts.
type Sequencer struct {
	db     storage.DB
	app    Applier
	cfg    Config
	writer uint64
	// stop ends waits for other writers' staged requests at Stop; commits
	// and this writer's own staging run to their end, bounded by their
	// deadlines.
	stop     context.Context
	stopWait context.CancelFunc

	q *groupcommit.Queue[any, any]

	mu sync.Mutex
	// started and decided count batches; settled is closed and replaced
	// whenever one is decided (Settle).
	started, decided uint64
	settled          chan struct{}

	// Guarded by the lead, not by mu.
	seq uint64
	// lastMarker is the seq of this writer's newest batch marker, which its
	// next batch clears; 0 before the first.
	lastMarker uint64
	lastHead   int64 // the newest head this writer committed (invariants)
}

// pending is one queued request.
type pending = groupcommit.Waiter[any, any]

type result struct {
	resp any
	err  error
}

// New returns a sequencer; Stop ends it. Each sequencer is a writer with a
// random identity, so batch markers of different processes never collide.
func New(db storage.DB, app Applier, cfg Config) *Sequencer {
	cfg.defaults()
	s := &Sequencer{db: db, app: app, cfg: cfg, writer: rand.Uint64(), settled: make(chan struct{})}
	s.stop, s.stopWait = context.WithCancel(context.Background())
	s.q = groupcommit.New[any, any](groupcommit.Limits{MaxBatch: cfg.MaxBatch, MaxBytes: cfg.BatchBytes}, ErrStopped)
	return s
}

// Do submits one write request and waits for its response. sizeHint is the
// request's encoded size, used to keep batches small. A request whose ctx
// ends before a batch takes it is answered with ctx's error and never
// applied; once taken, it is decided whatever ctx does, which keeps "did it
// apply?" answerable for the caller's retry logic.
func (s *Sequencer) Do(ctx context.Context, req any, sizeHint int) (any, error) {
	return s.q.Do(ctx, req, sizeHint, s.commit)
}

// Stop waits for the requests already queued to be decided; later ones get
// ErrStopped.
func (s *Sequencer) Stop() {
	s.stopWait()
	s.q.Stop()
}

// Settle returns once every batch that was being committed when it was
// called has been decided: none of them can be replayed any more. Physical
// compaction uses it so as never to remove history a replay of this
// writer's batches could read.
func (s *Sequencer) Settle(ctx context.Context) error {
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

func (s *Sequencer) batchStarted() {
	s.mu.Lock()
	s.started++
	s.mu.Unlock()
}

func (s *Sequencer) batchDecided() {
	s.mu.Lock()
	s.decided++
	close(s.settled)
	s.settled = make(chan struct{})
	s.mu.Unlock()
}

func (s *Sequencer) commit(batch []*pending) {
	for len(batch) > 0 {
		n := s.commitPrefix(batch)
		batch = batch[n:]
	}
}

// answer sends results to the first len(results) requests of batch.
func answer(batch []*pending, results []result) int {
	for i := range results {
		batch[i].Answer(results[i].resp, results[i].err)
	}
	return len(results)
}

// failAll answers the first n requests of batch with err.
func failAll(batch []*pending, n int, err error) int {
	results := make([]result, n)
	for i := range results {
		results[i] = result{err: err}
	}
	return answer(batch, results)
}
