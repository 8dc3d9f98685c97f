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
package revision

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

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

// Applier evaluates write requests. It never imports gRPC; requests and
// responses are whatever the applier defines.
type Applier interface {
	// Apply evaluates req on top of the store at revision rev (the newest
	// revision visible in tx), writes its mutations to tx and reports whether
	// it took revision rev+1. A request-level failure (bad lease, ...) is
	// returned as reqErr and must leave tx untouched; err means the storage
	// failed and the whole batch is retried.
	Apply(tx storage.Tx, rev int64, id RequestID, req any) (resp any, wrote bool, reqErr, err error)
	// Replay rebuilds the response of a request that an earlier attempt of the
	// same batch already committed, reading the store as of rev (the revision
	// before the request).
	Replay(tx storage.ReadTx, rev int64, id RequestID, req any) (resp any, wrote bool, reqErr, err error)
}

// Config tunes the sequencer.
type Config struct {
	// MaxBatch bounds the requests in one batch.
	MaxBatch int
	// BatchBytes bounds the bytes one batch writes; a request that alone is
	// larger still runs in a batch of its own, up to the storage limit.
	BatchBytes int
	// Observe, when set, is told each committed batch's size and duration.
	Observe func(requests int, bytes int, took time.Duration)
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

// ErrStopped is returned for requests submitted after Stop.
var ErrStopped = errors.New("revision: sequencer stopped")

// Sequencer batches write requests into storage transactions.
//
// There is no sequencer goroutine: the caller that finds no batch in
// progress commits one itself (LevelDB's writer queue). Requests that arrive
// meanwhile queue up, and when the batch is done its leader hands the lead to
// the oldest of them, which commits everything queued so far in one batch.
// A lone client thus commits on its own goroutine, without two goroutine
// hand-offs per write that cost a single client about a tenth of its puts.
type Sequencer struct {
	db     storage.DB
	app    Applier
	cfg    Config
	writer uint64

	mu      sync.Mutex
	waiting []*pending // queued, in arrival order
	leading bool       // a caller is committing a batch
	stopped bool
	idle    *sync.Cond // signalled when the lead is given up
	seq     uint64     // guarded by the lead, not by mu
}

type pending struct {
	ctx  context.Context
	req  any
	size int
	out  chan result   // the answer; buffered
	lead chan struct{} // told to lead the next batch; buffered
}

type result struct {
	resp any
	err  error
}

// New returns a sequencer; Stop ends it. Each sequencer is a writer with a
// random identity, so batch markers of different processes never collide.
func New(db storage.DB, app Applier, cfg Config) *Sequencer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = 2 << 20
	}
	s := &Sequencer{db: db, app: app, cfg: cfg, writer: rand.Uint64()}
	s.idle = sync.NewCond(&s.mu)
	return s
}

// Do submits one write request and waits for its response. sizeHint is the
// request's encoded size, used to keep batches small. A request whose ctx
// ends before a batch takes it is answered with ctx's error and never
// applied; once taken, it is decided whatever ctx does, which keeps "did it
// apply?" answerable for the caller's retry logic.
func (s *Sequencer) Do(ctx context.Context, req any, sizeHint int) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &pending{ctx: ctx, req: req, size: sizeHint, out: make(chan result, 1), lead: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, ErrStopped
	}
	s.waiting = append(s.waiting, p)
	lead := !s.leading
	s.leading = true
	s.mu.Unlock()
	for {
		if lead {
			s.lead()
		}
		select {
		case r := <-p.out:
			return r.resp, r.err
		case <-p.lead:
			lead = true
		}
	}
}

// lead commits one batch from the front of the queue, then passes the lead
// to the oldest request still waiting, or gives it up.
func (s *Sequencer) lead() {
	s.mu.Lock()
	batch := s.take()
	s.mu.Unlock()
	if len(batch) > 0 {
		s.commit(batch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) > 0 {
		s.waiting[0].lead <- struct{}{}
		return
	}
	s.leading = false
	s.idle.Broadcast()
}

// take removes the next batch from the queue; the caller holds mu. Requests
// whose context has ended are answered here, unapplied.
func (s *Sequencer) take() []*pending {
	var batch []*pending
	bytes, n := 0, 0
	for n < len(s.waiting) && len(batch) < s.cfg.MaxBatch && (len(batch) == 0 || bytes < s.cfg.BatchBytes) {
		p := s.waiting[n]
		n++
		if err := p.ctx.Err(); err != nil {
			p.out <- result{err: err}
			continue
		}
		batch = append(batch, p)
		bytes += p.size
	}
	clear(s.waiting[:n])
	s.waiting = s.waiting[n:]
	return batch
}

// Stop waits for the requests already queued to be decided; later ones get
// ErrStopped.
func (s *Sequencer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for s.leading {
		s.idle.Wait()
	}
}

// errShrink aborts an attempt whose batch outgrew BatchBytes at request n.
type errShrink struct{ n int }

func (e errShrink) Error() string { return fmt.Sprintf("revision: batch too large at request %d", e.n) }

// errLanded aborts an attempt (without committing) that found its batch
// already committed; the responses it rebuilt are the answer.
var errLanded = errors.New("revision: batch already committed")

func (s *Sequencer) commit(batch []*pending) {
	for len(batch) > 0 {
		n := s.commitPrefix(batch)
		batch = batch[n:]
	}
}

// commitPrefix commits as many requests from the front of batch as fit and
// answers them; it returns how many it answered.
func (s *Sequencer) commitPrefix(batch []*pending) int {
	s.seq++
	seq := s.seq
	start := time.Now()
	n := len(batch)
	results := make([]result, n)
	var written int
	ctx := context.Background()
	err := s.db.Update(ctx, func(tx storage.Tx) error {
		marker, err := tx.Get(keyspace.Batch(s.writer, seq))
		if err != nil {
			return err
		}
		if marker != nil {
			if err := s.replay(tx, marker, batch[:n], results, seq); err != nil {
				return err
			}
			return errLanded
		}
		head, err := ReadHead(tx)
		if err != nil {
			return err
		}
		ctr := &countingTx{Tx: tx}
		base, rev := head.Rev, head.Rev
		for i := 0; i < n; i++ {
			p := batch[i]
			id := RequestID{Writer: s.writer, Seq: seq, Index: uint32(i)}
			resp, wrote, reqErr, err := s.app.Apply(ctr, rev, id, p.req)
			if err != nil {
				return err
			}
			if ctr.bytes > s.cfg.BatchBytes && i > 0 {
				return errShrink{n: i}
			}
			results[i] = result{resp: resp, err: reqErr}
			if wrote {
				rev++
			}
		}
		written = ctr.bytes
		if ctr.bytes == 0 {
			return nil // nothing written; nothing to make idempotent
		}
		if rev != base {
			tx.Set(keyspace.Head, encodeHead(Head{Rev: rev, Writer: s.writer, Seq: seq}))
		}
		tx.Set(keyspace.Batch(s.writer, seq), binary.BigEndian.AppendUint64(nil, uint64(base)))
		if seq > markerWindow {
			// A point delete of the one marker leaving the window: range
			// deletions would pile up as tombstones on every batch.
			tx.Clear(keyspace.Batch(s.writer, seq-markerWindow))
		}
		return nil
	})
	var shrink errShrink
	switch {
	case errors.As(err, &shrink):
		n = shrink.n
		return s.commitPrefix(batch[:n])
	case errors.Is(err, errLanded):
		err = nil
	}
	if err != nil {
		for i := 0; i < n; i++ {
			results[i] = result{err: err}
		}
	} else if s.cfg.Observe != nil {
		s.cfg.Observe(n, written, time.Since(start))
	}
	for i := 0; i < n; i++ {
		batch[i].out <- results[i]
	}
	return n
}

// markerWindow is how many of its newest batch markers a writer keeps. A
// marker is only read by the retries of its own batch, so a small window is
// plenty; older ones are cleared as new batches commit.
const markerWindow = 64

func (s *Sequencer) replay(tx storage.ReadTx, marker []byte, batch []*pending, results []result, seq uint64) error {
	if len(marker) != 8 {
		return fmt.Errorf("revision: batch marker of %d bytes", len(marker))
	}
	rev := int64(binary.BigEndian.Uint64(marker))
	for i, p := range batch {
		id := RequestID{Writer: s.writer, Seq: seq, Index: uint32(i)}
		resp, wrote, reqErr, err := s.app.Replay(tx, rev, id, p.req)
		if err != nil {
			return err
		}
		results[i] = result{resp: resp, err: reqErr}
		if wrote {
			rev++
		}
	}
	return nil
}

// countingTx measures the bytes a batch writes, to keep it under BatchBytes.
type countingTx struct {
	storage.Tx
	bytes int
}

func (c *countingTx) Set(k, v []byte) {
	c.bytes += len(k) + len(v)
	c.Tx.Set(k, v)
}

func (c *countingTx) Clear(k []byte) {
	c.bytes += len(k)
	c.Tx.Clear(k)
}

func (c *countingTx) ClearRange(b, e []byte) {
	c.bytes += len(b) + len(e)
	c.Tx.ClearRange(b, e)
}
