package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Config tunes a Store. The zero value is usable.
type Config struct {
	Logger *zap.Logger
	// PageKeys bounds the index entries one read transaction scans; longer
	// Ranges are paged across transactions at a fixed revision.
	PageKeys int
	// CompactionBatch bounds the keys one physical-compaction transaction
	// cleans up.
	CompactionBatch int
	Sequencer       revision.Config
	// ObserveCompaction, when set, is told how long each physical compaction
	// took and how many keys it cleaned.
	ObserveCompaction func(took time.Duration, keys int)
}

// Store is etcd's key-value model over a storage.DB.
type Store struct {
	db  storage.DB
	cfg Config
	lg  *zap.Logger
	seq *revision.Sequencer

	compactWake chan struct{}
	stop        chan struct{}
	// ctx ends when the store closes, cancelling background storage calls.
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	compactMu      sync.Mutex
	compactWaiters []compactWaiter

	counts *countCache // range counts, so counting need not scan (countcache.go)

	watchSizes watchSizes // sizes watch-log reads meet (watchread.go)
}

var _ revision.Applier = (*Store)(nil)

// Open starts a store on db. The caller keeps ownership of db.
func Open(db storage.DB, cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.PageKeys <= 0 {
		cfg.PageKeys = 10_000
	}
	if cfg.CompactionBatch <= 0 {
		cfg.CompactionBatch = 1_000
	}
	s := &Store{
		db: db, cfg: cfg, lg: cfg.Logger,
		compactWake: make(chan struct{}, 1),
		stop:        make(chan struct{}),
		counts:      newCountCache(),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := db.View(context.Background(), func(tx storage.ReadTx) error {
		_, err := revision.ReadHead(tx)
		return err
	}); err != nil {
		return nil, fmt.Errorf("mvcc: read head: %w", err)
	}
	s.seq = revision.New(db, s, cfg.Sequencer)
	s.wg.Add(1)
	go s.compactor()
	s.wakeCompactor()
	return s, nil
}

// Close stops accepting writes, finishes the queued ones and stops the
// background compactor. It does not close the storage.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		s.seq.Stop()
		close(s.stop)
		s.cancel()
		s.wg.Wait()
	})
}

// DB returns the storage the store runs on.
func (s *Store) DB() storage.DB { return s.db }

// Rev returns the current revision and the compacted revision.
func (s *Store) Rev(ctx context.Context) (rev, compacted int64, err error) {
	err = s.db.View(ctx, func(tx storage.ReadTx) error {
		h, c, err := readState(tx)
		rev, compacted = h.Rev, c.Requested
		return err
	})
	return rev, compacted, err
}

func readState(tx storage.ReadTx) (revision.Head, compaction, error) {
	vals, err := tx.GetMany([][]byte{keyspace.Head, keyspace.Compaction})
	if err != nil {
		return revision.Head{}, compaction{}, err
	}
	h, err := revision.DecodeHead(vals[0])
	if err != nil {
		return h, compaction{}, err
	}
	c, err := decodeCompaction(vals[1])
	return h, c, err
}

func leaseExistsIn(tx storage.ReadTx) func(int64) (bool, error) {
	return func(id int64) (bool, error) {
		v, err := tx.Get(keyspace.Lease(id))
		return v != nil, err
	}
}

// write sends a request through the sequencer and unwraps the outcome.
func (s *Store) write(ctx context.Context, req any, size int) (any, error) {
	resp, err := s.seq.Do(ctx, req, size)
	if errors.Is(err, revision.ErrStopped) {
		return nil, ErrStopped
	}
	return resp, err
}

// Put stores a key.
func (s *Store) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	resp, err := s.write(ctx, r, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.PutResponse), nil
}

// DeleteRange deletes keys.
func (s *Store) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := s.write(ctx, r, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.DeleteRangeResponse), nil
}

// Txn runs a transaction; read-only ones never enter the write path.
func (s *Store) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if txnReadOnly(r) {
		return s.readTxn(ctx, r)
	}
	resp, err := s.write(ctx, r, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.TxnResponse), nil
}

// txnReadOnly mirrors etcd: only top-level ops decide, and a nested Txn makes
// a Txn a write.
func txnReadOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if op.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}

func (s *Store) readTxn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	var resp *pb.TxnResponse
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		h, c, err := readState(tx)
		if err != nil {
			return err
		}
		ev := &evaluator{tx: tx, rev: h.Rev, compactRev: c.Requested, leaseExists: leaseExistsIn(tx)}
		resp, err = ev.txn(r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Apply implements revision.Applier.
func (s *Store) Apply(tx storage.Tx, rev int64, id revision.RequestID, req any) (any, bool, error, error) {
	switch r := req.(type) {
	case *compactRequest:
		return s.applyCompact(tx, rev, id, r)
	case *RevokeRequest:
		return s.applyRevoke(tx, rev, id, r)
	}
	ev, resp, reqErr, err := evaluate(tx, rev, req, leaseExistsIn(tx))
	if err != nil || reqErr != nil || len(ev.changes) == 0 {
		return resp, false, reqErr, err
	}
	writeChanges(tx, rev+1, id, ev.changes)
	return resp, true, nil, nil
}

// Replay implements revision.Applier: the same evaluation against history;
// whether the request wrote is read from the revision log.
func (s *Store) Replay(tx storage.ReadTx, rev int64, id revision.RequestID, req any) (any, bool, error, error) {
	switch r := req.(type) {
	case *compactRequest:
		return s.replayCompact(tx, rev, id, r)
	case *RevokeRequest:
		return s.replayRevoke(tx, rev, id, r)
	}
	// A replay cannot repeat the lease check: the lease may be gone since.
	anyLease := func(int64) (bool, error) { return true, nil }
	ev, resp, reqErr, err := evaluate(tx, rev, req, anyLease)
	if err != nil || reqErr != nil || len(ev.changes) == 0 {
		return resp, false, reqErr, err
	}
	landed, err := loggedBy(tx, rev+1, id)
	if err != nil {
		return nil, false, nil, err
	}
	if !landed {
		// The evaluation would have written, so the only way it did not is
		// the lease check that a replay cannot repeat.
		return nil, false, ErrLeaseNotFound, nil
	}
	return resp, true, nil, nil
}

// evaluate runs one KV write request as of rev, splitting its failure into a
// request-level error (returned to the client) and a storage error (the
// batch is retried).
func evaluate(tx storage.ReadTx, rev int64, req any, leaseExists func(int64) (bool, error)) (ev *evaluator, resp any, reqErr, err error) {
	_, c, err := readState(tx)
	if err != nil {
		return nil, nil, nil, err
	}
	ev = &evaluator{tx: tx, rev: rev, compactRev: c.Requested, leaseExists: leaseExists}
	resp, err = ev.eval(req)
	switch {
	case err == nil:
		return ev, resp, nil, nil
	case domainError(err):
		return ev, nil, err, nil
	default:
		return ev, nil, nil, err
	}
}

func loggedBy(tx storage.ReadTx, rev int64, id revision.RequestID) (bool, error) {
	v, err := tx.Get(keyspace.Log(rev, 0))
	if err != nil || v == nil {
		return false, err
	}
	e, err := decodeLog([][]byte{v})
	if err != nil {
		return false, err
	}
	return e.ID == id, nil
}

func (e *evaluator) eval(req any) (any, error) {
	switch r := req.(type) {
	case *pb.PutRequest:
		if err := e.checkLease(r.Lease); err != nil {
			return nil, err
		}
		return e.put(r)
	case *pb.DeleteRangeRequest:
		return e.deleteRange(r)
	case *pb.TxnRequest:
		return e.txn(r)
	}
	return nil, fmt.Errorf("mvcc: unknown request %T", req)
}

// writeChanges applies one request's changes at revision rev: the latest
// index, the history (chunked), lease attachments and the revision log.
func writeChanges(tx storage.Tx, rev int64, id revision.RequestID, changes []change) {
	entry := logEntry{ID: id, Events: make([]logEvent, 0, len(changes))}
	for sub, c := range changes {
		ev := logEvent{Type: evPut, Sub: int64(sub), Key: c.key}
		if c.prev != nil {
			ev.PrevRev = c.prev.meta.ModRev
			if c.prev.meta.Lease != 0 && (c.meta.Tombstone || c.prev.meta.Lease != c.meta.Lease) {
				tx.Clear(keyspace.Attach(c.prev.meta.Lease, c.key))
			}
		}
		tx.Set(keyspace.Latest(c.key), encodeMeta(c.meta))
		if c.meta.Tombstone {
			ev.Type = evDelete
			tx.Set(keyspace.History(c.key, rev), encodeVersion(version{Sub: int64(sub), Tombstone: true, Chunks: 1}))
		} else {
			first, rest := splitValue(c.value)
			tx.Set(keyspace.History(c.key, rev), encodeVersion(version{
				Sub: int64(sub), CreateRev: c.meta.CreateRev, Version: c.meta.Version, Lease: c.meta.Lease,
				Chunks: 1 + len(rest), ValueLen: int64(len(c.value)), First: first,
			}))
			for i, ch := range rest {
				tx.Set(keyspace.Chunk(c.key, rev, i+1), ch)
			}
			if c.meta.Lease != 0 {
				tx.Set(keyspace.Attach(c.meta.Lease, c.key), nil)
			}
		}
		entry.Events = append(entry.Events, ev)
	}
	for i, part := range encodeLog(entry) {
		tx.Set(keyspace.Log(rev, i), part)
	}
}

// Range reads a range at a revision, paging across read transactions at that
// fixed revision so that no single storage transaction grows with the range.
func (s *Store) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	return s.rangeRead(ctx, r, true)
}

// RangeChunk is Range without the total count (etcd 3.7's withTotalCount
// false): it stops reading once it has the keys the limit asks for, so a
// streamed range does not re-count the rest of the range for every chunk.
// Count in its response covers only the keys read.
func (s *Store) RangeChunk(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	return s.rangeRead(ctx, r, false)
}

func (s *Store) rangeRead(ctx context.Context, r *pb.RangeRequest, withCount bool) (*pb.RangeResponse, error) {
	end := normEnd(r.RangeEnd)
	keep := keepFor(r)
	var (
		head, rev int64
		kept      []*entry
		count     int
	)
	// A range whose count the cache knows reads only the keys it returns.
	// Filters and sorting read the whole range anyway.
	countable := withCount && end != nil && (r.CountOnly || keep >= 0)
	scanCount := withCount
	cached := int64(-1)
	cursor := r.Key
	first := true
	for cursor != nil {
		var page []*entry
		var pageCount int
		var next []byte
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			page, pageCount, next = nil, 0, nil
			h, c, err := readState(tx)
			if err != nil {
				return err
			}
			if first {
				head, rev = h.Rev, r.Revision
				switch {
				case rev > head:
					return ErrFutureRev
				case rev <= 0:
					rev = head
				}
			}
			if rev < c.Requested {
				return ErrCompacted
			}
			if first && countable {
				n, ok, err := s.counts.countAt(tx, r.Key, r.RangeEnd, rev, c)
				if err != nil {
					return err
				}
				cached = -1
				if ok {
					cached = n
				}
				scanCount = cached < 0
			}
			if r.CountOnly && !scanCount {
				return nil
			}
			collect := func(key []byte, m meta, ver *version) bool {
				pageCount++
				if keep < 0 || len(kept)+len(page) < keep {
					page = append(page, &entry{key: bytes.Clone(key), meta: m, ver: ver})
				}
				return scanCount || keep < 0 || len(kept)+len(page) < keep
			}
			if end == nil {
				e, err := getAt(tx, r.Key, rev, nil)
				if e != nil {
					collect(e.key, e.meta, e.ver)
				}
				if err != nil {
					return err
				}
			} else if len(end) == 0 || bytes.Compare(cursor, end) < 0 {
				if next, err = scanLive(tx, cursor, end, rev, s.cfg.PageKeys, collect); err != nil {
					return err
				}
			}
			// A small range read whole in this transaction gets its values
			// here too: a second transaction would cost as much as the
			// lookup (a single-key GET is most of what kube-apiserver
			// reads from storage). A few values that the sort and limit
			// then drop are the price.
			if first && next == nil && len(page) <= inlineValues && !r.KeysOnly && !r.CountOnly {
				return resolveValues(tx, page)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		first = false
		kept = append(kept, page...)
		count += pageCount
		cursor = next
		if !scanCount && (r.CountOnly || keep >= 0 && len(kept) >= keep) {
			break
		}
	}
	if cached >= 0 {
		count = int(cached)
	}
	resp, err := buildRange(r, kept, count, head, func(es []*entry) error { return s.resolvePaged(ctx, es, rev) })
	if err == nil && withCount && end != nil {
		// Every counted range leaves its count, however it was read.
		s.counts.put(r.Key, r.RangeEnd, rev, resp.Count)
		if resp.More && len(resp.Kvs) > 0 && !r.CountOnly {
			last := resp.Kvs[len(resp.Kvs)-1].Key
			s.counts.put(append(bytes.Clone(last), 0), r.RangeEnd, rev, resp.Count-int64(len(resp.Kvs)))
		}
	}
	return resp, err
}

// inlineValues is the most entries whose values a range resolves in the
// transaction that found them.
const inlineValues = 16

// resolvePaged reads values in bounded read transactions, failing if a
// compaction past rev could have removed them meanwhile.
func (s *Store) resolvePaged(ctx context.Context, es []*entry, rev int64) error {
	const perTx = 2_000
	if !slices.ContainsFunc(es, func(e *entry) bool { return !e.has }) {
		return nil // resolved in the transaction that found them
	}
	for len(es) > 0 {
		n := min(len(es), perTx)
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			_, c, err := readState(tx)
			if err != nil {
				return err
			}
			if rev < c.Requested {
				return ErrCompacted
			}
			return resolveValues(tx, es[:n])
		})
		if err != nil {
			return err
		}
		es = es[n:]
	}
	return nil
}
