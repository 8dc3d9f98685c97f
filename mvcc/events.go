package mvcc

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// RevisionEvents is everything one revision changed, in etcd's event order.
// Events carry PrevKv whenever the key existed before; watchers that did not
// ask for it drop it.
type RevisionEvents struct {
	Rev    int64
	Events []*mvccpb.Event
}

// WaitRev blocks until the current revision exceeds after, and returns it.
// It is woken by the storage's commit notification, never by polling, or
// by wake closing: then it returns the last head it read, which may be
// after itself. wake ends only the wait for a notification, never a read
// of the head: a caller that learns of a commit elsewhere (a replica's
// watch hub, told by the owner) would otherwise throw away the read it
// interrupts, and it learns of one at nearly every commit.
func (s *Store) WaitRev(ctx context.Context, after int64, wake <-chan struct{}) (int64, error) {
	// A revision this store committed needs no read (tail.go); while it
	// commits, the next one usually comes before a storage watch would be
	// set up.
	if rev, ok := s.tail.awaitCommitPast(ctx, after, s.cfg.Now(), ownWritesActive, s.cfg.OwnCommitGrace, wake); ok {
		return rev, nil
	}
	// When the head is this store's own last commit, the storage's wait
	// compares it with what the commit wrote, without a read first.
	raw, known := s.tail.headAt(after)
	rev := after
	f := storage.Latest
	for {
		if !known {
			var err error
			raw, rev, err = s.readHead(storage.WithFreshness(ctx, f))
			if err != nil || rev > after {
				return rev, err
			}
			if f == storage.Recent {
				// The recent snapshot predates the change that woke us (a
				// commit through another handle): read the latest before
				// waiting again.
				f = storage.Latest
				continue
			}
		}
		known = false
		if woken, err := s.waitChange(ctx, raw, wake); woken || err != nil {
			return rev, err
		}
		if rev, ok := s.ownCommitPast(ctx, after); ok {
			return rev, nil
		}
		// When a commit of this DB woke us, a recent snapshot has it
		// (storage.Recent never reads below one) and may spare
		// FoundationDB's read version round trip.
		f = storage.Recent
	}
}

// ReadTail answers r from the revisions the store holds in memory (the
// log's tail), never from storage: ok is false when it does not hold
// r.From. The write owner's commit feed sends its followers what it holds.
func (s *Store) ReadTail(r WatchRead) (b EventBatch, ok bool) {
	if r.MaxBytes <= 0 {
		r.MaxBytes = DefaultWatchReadBytes
	}
	return s.tail.read(r)
}

// Compacted is the newest compaction revision the store has seen, without
// a read.
func (s *Store) Compacted() int64 { return s.tail.knownCompacted() }

// Hold takes into the log's tail revisions another process committed and
// read from its own tail with every previous value (ReadTail with PrevKV),
// and the compaction revision it knew of: the write owner's, sent to the
// replicas that follow its commit feed. The store's watch reads then
// answer them from memory. Revisions are taken in ascending order only,
// past the newest held.
func (s *Store) Hold(revs []RevisionEvents, compacted int64) { s.tail.hold(revs, compacted) }

// ownWritesActive is how recently a store must have committed for WaitRev
// to wait for its next commit before it sets up a storage watch.
const ownWritesActive = time.Second

// ownCommitPast reports the newest revision this store committed if it is
// past after. The storage wakes a store's waiters inside the commit, before
// the sequencer hears of it: a batch of this store still undecided is
// waited for, so that a wake by its commit finds it decided — and its
// revisions in the log's tail — instead of reading the head.
func (s *Store) ownCommitPast(ctx context.Context, after int64) (int64, bool) {
	if decided := s.tail.running(); decided != nil {
		select {
		case <-decided:
		case <-ctx.Done():
		}
	}
	rev := s.tail.committedRev()
	return rev, rev > after
}

// waitChange waits for the head to change from raw, or for wake to close
// (woken, with no error), or for ctx to end.
func (s *Store) waitChange(ctx context.Context, raw []byte, wake <-chan struct{}) (woken bool, err error) {
	select {
	case <-wake:
		return true, nil
	default:
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Cancels the wait when wake closes; ends with it otherwise.
	go func() {
		select {
		case <-wake:
			cancel()
		case <-wctx.Done():
		}
	}()
	err = s.db.WaitChange(wctx, keyspace.Head, raw)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return true, nil
	}
	return false, err
}

// readHead reads the raw head and its revision.
func (s *Store) readHead(ctx context.Context) ([]byte, int64, error) {
	var raw []byte
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		raw, err = tx.Get(keyspace.Head)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	h, err := revision.DecodeHead(raw)
	if err != nil {
		return nil, 0, err
	}
	return raw, h.Rev, nil
}
