package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	// StageBytes is how much a DeleteRange or a lease revoke may write in
	// the batch it arrives in; a larger one is staged (stage.go). 0 means
	// 512 KiB.
	StageBytes int
	// StageWorkers bounds the staging transactions in flight; 0 means 4.
	StageWorkers int
	// StageChunkBytes bounds what one staging transaction writes; 0 means
	// 256 KiB, far below FoundationDB's 10 MB so that each commits quickly.
	StageChunkBytes int
	// SoleWriter says that no other process writes the storage (the
	// embedded backend). Physical compaction then waits only for this
	// store's own batches instead of the sequencer's replay window
	// (compactTarget).
	SoleWriter bool
	// ReadPinWindow is how long a Range that reads across several
	// transactions may rely on its read pin (readpin.go), and after how
	// long the compactor clears a pin it found; 0 means a minute.
	ReadPinWindow time.Duration
	// Now is the clock physical compaction measures its waits with; nil
	// means time.Now.
	Now func() time.Time
	// ObserveCompaction, when set, is told how long each physical compaction
	// took and how many keys it cleaned.
	ObserveCompaction func(took time.Duration, keys int)
	// LogTailBytes bounds the revisions this store committed that it keeps
	// in memory for watch reads (tail.go); 0 means 4 MiB, negative none.
	LogTailBytes int
	// PrevValueBytes bounds the newest values of the keys in the tail's
	// revisions that it keeps, so that a later write's previous value is
	// known without a read (latest.go); 0 means 64 MiB, negative none.
	PrevValueBytes int
	// OwnCommitGrace is how long WaitRev, on a store that committed in the
	// last second, waits for its next commit before it sets up a storage
	// watch (a transaction on FoundationDB); another process's commit, and
	// a staged request's, is seen that much later. 0 means 50 ms, or 5 ms
	// on a store nothing else writes (SoleWriter), whose storage watch
	// costs no transaction; negative never waits.
	OwnCommitGrace time.Duration
}

// Store is etcd's key-value model over a storage.DB.
type Store struct {
	db  storage.DB
	cfg Config
	lg  *zap.Logger
	seq *revision.Sequencer[writeResponse]

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
	states stateShare  // the newest snapshot's state, read once (stateshare.go)
	tail   *logTail    // the revisions this store committed last (tail.go)

	watchSizes watchSizes // sizes watch-log reads meet (watchread.go)
}

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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReadPinWindow <= 0 {
		cfg.ReadPinWindow = time.Minute
	}
	if cfg.StageBytes <= 0 {
		cfg.StageBytes = 512 << 10
	}
	if cfg.StageWorkers <= 0 {
		cfg.StageWorkers = 4
	}
	if cfg.StageChunkBytes <= 0 {
		cfg.StageChunkBytes = 256 << 10
	}
	if cfg.LogTailBytes == 0 {
		cfg.LogTailBytes = 4 << 20
	}
	if cfg.PrevValueBytes == 0 {
		cfg.PrevValueBytes = 64 << 20
	}
	if cfg.OwnCommitGrace == 0 {
		cfg.OwnCommitGrace = 50 * time.Millisecond
		if cfg.SoleWriter {
			cfg.OwnCommitGrace = 5 * time.Millisecond
		}
	}
	cfg.Sequencer = cfg.Sequencer.WithDefaults()
	s := &Store{
		db: db, cfg: cfg, lg: cfg.Logger,
		compactWake: make(chan struct{}, 1),
		stop:        make(chan struct{}),
		counts:      newCountCache(),
		tail:        newLogTail(cfg.LogTailBytes, cfg.PrevValueBytes),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := db.View(context.Background(), func(tx storage.ReadTx) error {
		_, err := revision.ReadHead(tx)
		return err
	}); err != nil {
		return nil, fmt.Errorf("mvcc: read head: %w", err)
	}
	s.seq = revision.New[writeResponse](db, applier{s}, cfg.Sequencer)
	if cfg.SoleWriter {
		// Nobody else can be staging: a reservation left pending is a
		// crashed run's, to be finished before anything else is written.
		if err := s.seq.FinishAbandoned(); err != nil {
			s.seq.Stop()
			return nil, fmt.Errorf("mvcc: finish an abandoned staged write: %w", err)
		}
	}
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
		f, err := readFirst(ctx, tx, firstReads{}, &s.states)
		rev, compacted = f.head.Rev, f.comp.Requested
		return err
	})
	return rev, compacted, err
}

func readState(tx storage.ReadTx) (revision.Head, compaction, error) {
	f, err := readFirst(context.Background(), tx, firstReads{}, nil)
	return f.head, f.comp, err
}

// keyAtHead is what a single-key read learns in the round trip that reads
// the state: the key's latest entry (latestRead), or, read at the head, the
// newest version in its history — usually the live one, whose value then
// needs no round trip of its own.
type keyAtHead struct {
	latest     []byte
	latestRead bool
	newest     *storage.KeyValue
}

// firstReads names what a read transaction fetches in the round trip that
// reads the head and the compaction record, so that it waits for no round
// trip of its own to find its keys.
type firstReads struct {
	key []byte // a single key: its latest entry
	// atHead: key is read at the head, from the newest version in its
	// history instead of its latest entry, and without the compaction
	// record, which never passes the head.
	atHead bool
	index  *storage.RangeRead // a range's page: its first index entries
}

// firstRead is what that round trip returned.
type firstRead struct {
	head  revision.Head
	comp  compaction
	key   keyAtHead
	index []storage.KeyValue
}

// readFirst reads the state and what want names in one round trip. A
// single key read at the head costs two reads (the head and the key's
// newest version) instead of four, and one when another View of the same
// snapshot reads the state (share, stateshare.go): on FoundationDB each
// read is a request that the client's one network thread and the storage
// server handle, and those requests, not the round trip, bound how many
// Ranges a process serves.
func readFirst(ctx context.Context, tx storage.ReadTx, want firstReads, share *stateShare) (firstRead, error) {
	var f firstRead
	// A page of a range reads many index entries in the same round trip:
	// it does not lead, so that no GET waits for a LIST's page.
	st, role := share.join(storage.SnapshotOf(tx), want.index == nil)
	plan := planFirst(want, role, scansInPlace(tx))
	vals, kvs, err := storage.ReadBatch(tx, plan.keys, plan.ranges)
	if err == nil {
		switch {
		case plan.compAt >= 0:
			f.head, f.comp, err = decodeHeadAndCompaction(vals[plan.headAt], vals[plan.compAt])
		case plan.headAt >= 0:
			f.head, err = revision.DecodeHead(vals[plan.headAt])
		case plan.stateAt >= 0:
			f.head, f.comp, err = decodeState(kvs[plan.stateAt])
		default:
			var ok bool
			if f.head, f.comp, ok, err = st.wait(ctx); err == nil && !ok {
				// The leading View's read failed: a read of its own.
				f.head, f.comp, err = readState(tx)
			}
		}
	}
	if role == stateLead {
		st.publish(f.head, f.comp, err)
	}
	if err != nil {
		return f, err
	}
	switch {
	case want.atHead:
		if len(kvs[0]) == 1 {
			f.key.newest = &kvs[0][0]
		}
	case want.key != nil:
		f.key.latest, f.key.latestRead = vals[0], true
	}
	if want.index != nil {
		f.index = kvs[plan.indexAt]
	}
	return f, nil
}

// firstPlan is what readFirst's round trip reads, and where in its answer
// the state is: the head alone at keys[headAt], the head and the
// compaction record at ranges[stateAt] or at keys[headAt] and
// keys[compAt], or neither (all -1) when another View of the snapshot
// reads them.
type firstPlan struct {
	keys                    [][]byte
	ranges                  []storage.RangeRead
	headAt, compAt, stateAt int
	indexAt                 int // where want.index's entries are
}

// stateRole is how a View takes part in reading its snapshot's state.
type stateRole int

const (
	stateOwn    stateRole = iota // reads it for itself alone
	stateLead                    // reads it for every View of its snapshot
	stateFollow                  // takes what the leading View read
)

func planFirst(want firstReads, role stateRole, inPlace bool) firstPlan {
	p := firstPlan{headAt: -1, compAt: -1, stateAt: -1, indexAt: -1}
	switch {
	case want.atHead:
		h := keyspace.HistoryPrefix(want.key)
		p.ranges = append(p.ranges, storage.RangeRead{Begin: h, End: storage.Strinc(h), Opt: storage.RangeOptions{Limit: 1, Reverse: true}})
	case want.key != nil:
		p.keys = append(p.keys, keyspace.Latest(want.key))
	}
	if want.index != nil {
		p.indexAt = len(p.ranges)
		p.ranges = append(p.ranges, *want.index)
	}
	switch {
	case role == stateFollow:
	case role == stateOwn && want.atHead:
		// No compaction passes the head: the head alone.
		p.headAt = len(p.keys)
		p.keys = append(p.keys, keyspace.Head)
	case inPlace:
		// Every commit rewrites the head, and an LSM store keeps each
		// version until a flush or compaction merges them: a range read
		// of the two steps over every one of them after the newest
		// (BenchmarkRangeAfterWrites). A point read stops at the newest.
		p.headAt, p.compAt = len(p.keys), len(p.keys)+1
		p.keys = append(p.keys, keyspace.Head, keyspace.Compaction)
	default:
		// The head and the compaction record are one range read, one
		// request; the leading View reads both for the Views that follow
		// it, whatever they read.
		mb, me := keyspace.HeadAndCompaction()
		p.stateAt = len(p.ranges)
		p.ranges = append(p.ranges, storage.RangeRead{Begin: mb, End: me})
	}
	return p
}

// decodeState decodes the head and the compaction record from a read of
// keyspace.HeadAndCompaction.
func decodeState(kvs []storage.KeyValue) (revision.Head, compaction, error) {
	var head, comp []byte
	for _, kv := range kvs {
		switch {
		case bytes.Equal(kv.Key, keyspace.Head):
			head = kv.Value
		case bytes.Equal(kv.Key, keyspace.Compaction):
			comp = kv.Value
		}
	}
	return decodeHeadAndCompaction(head, comp)
}

// decodeHeadAndCompaction decodes the values of keyspace.Head and
// keyspace.Compaction (nil where absent).
func decodeHeadAndCompaction(head, comp []byte) (revision.Head, compaction, error) {
	h, err := revision.DecodeHead(head)
	if err != nil {
		return h, compaction{}, err
	}
	c, err := decodeCompaction(comp)
	return h, c, err
}

// entry is key's entry at rev, from what the state's round trip read of it.
// Without its latest entry, the newest version in its history is the one
// live at rev (the head) when it is not newer: every write puts a key's
// version in history in the transaction that writes its latest entry, and
// compaction keeps a key's newest version, or drops a deleted key's history
// with its latest entry, in one transaction. A newer one is a staged
// delete's tombstone, written above the head before the delete is
// published; then the latest entry, read now, tells.
func (k keyAtHead) entry(tx storage.ReadTx, key []byte, rev int64) (*entry, error) {
	if k.latestRead {
		return entryAt(tx, key, k.latest, rev)
	}
	if k.newest == nil {
		return nil, nil
	}
	_, modRev, err := keyspace.ParseHistory(k.newest.Key)
	if err != nil {
		return nil, err
	}
	if modRev > rev {
		return getAt(tx, key, rev, nil)
	}
	v, err := decodeVersion(k.newest.Value)
	if err != nil || v.Tombstone {
		return nil, err
	}
	return &entry{key: bytes.Clone(key), meta: v.Meta(modRev), ver: &v}, nil
}

func leaseExistsIn(tx storage.ReadTx) func(int64) (bool, error) {
	return func(id int64) (bool, error) {
		v, err := tx.Get(keyspace.Lease(id))
		return v != nil, err
	}
}

// write sends a request through the sequencer and turns its failures into
// the store's errors, each of which is one of etcd's.
func (s *Store) write(ctx context.Context, req revision.Request[writeResponse], size int) (writeResponse, error) {
	resp, err := s.seq.Do(ctx, req, size)
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, revision.ErrStopped) || errors.Is(err, storage.ErrClosed):
		return nil, fmt.Errorf("%w (%w)", ErrStopped, err)
	case errors.Is(err, revision.ErrTooLarge):
		return nil, fmt.Errorf("%w (%w)", ErrRequestTooLarge, err)
	case errors.Is(err, revision.ErrTimeout):
		return nil, fmt.Errorf("%w (%w)", ErrTimeout, err)
	case errors.Is(err, revision.ErrYielded):
		return nil, fmt.Errorf("%w (%w)", ErrYielded, err)
	}
	return nil, err
}

// Put stores a key.
func (s *Store) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	resp, err := s.write(ctx, putRequest{s: s, r: r}, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.PutResponse), nil
}

// DeleteRange deletes keys.
func (s *Store) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := s.write(ctx, deleteRequest{s: s, r: r}, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.DeleteRangeResponse), nil
}

// Txn runs a transaction; read-only ones never enter the write path.
func (s *Store) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if TxnReadOnly(r) {
		return s.readTxn(ctx, r)
	}
	resp, err := s.write(ctx, txnRequest{s: s, r: r}, proto.Size(r))
	if err != nil {
		return nil, err
	}
	return resp.(*pb.TxnResponse), nil
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

// evaluate runs one KV write request as of rev under compaction revision
// compacted, splitting its failure into a request-level error (returned to
// the client) and a storage error (the batch is retried).
func evaluate(tx storage.ReadTx, compacted, rev int64, leaseExists func(int64) (bool, error), eval kvEval) (ev *evaluator, resp writeResponse, reqErr, err error) {
	ev = &evaluator{tx: tx, rev: rev, compactRev: compacted, leaseExists: leaseExists}
	resp, err = eval(ev)
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
