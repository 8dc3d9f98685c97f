// Package watchhub fans the revision log out to every watcher of the
// process. It is the storage half of etcd's Watch service (etcd's
// watchable_store.go); server/watch is the gRPC half.
//
// One goroutine tails the revision log: woken by the storage's commit
// notification (Source.WaitRev, never a fixed-interval poll), it reads each
// new revision once (Source.ReadWatchEvents) and hands it to every matching
// watcher. Watchers are in one of three states, as in etcd:
//
//   - synced: in the hub's index; the hub puts their events straight into
//     their stream's queue. A watcher's events are shared *Event values,
//     never copied per watcher, each encoded at most once.
//   - unsynced: its events come from the revision log, read by its
//     stream's catch-up goroutine in batches shared by every unsynced
//     watcher of the stream, until it reaches the hub's revision and
//     rejoins the index under the hub's lock — so nothing is missed and
//     nothing is sent twice. A watcher created in the past starts here.
//   - lagging (etcd's victims): a synced watcher whose stream queue was full
//     when the hub had an event for it. The hub never waits: the watcher
//     leaves the index and, unsynced, catches up from the revision log at the
//     pace of its stream. Every stream queue is bounded in entries and bytes.
//
// Each stream's responses go through one FIFO queue, so a progress
// notification (no events, header revision R) is queued only after every
// event <= R of the stream's watchers: the answer to a progress request waits
// until no watcher of the stream is unsynced and every event up to the
// revision the store had when the request arrived has been queued — by the
// hub, or, when the request's own read of the log shows that none of the
// revisions the hub has yet to dispatch is for the stream, at once.
package watchhub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// Source is what the hub reads; *mvcc.Store implements it.
type Source interface {
	// Rev returns the current and the compacted revision.
	Rev(ctx context.Context) (rev, compacted int64, err error)
	// WaitRev blocks until the current revision exceeds after, or until
	// wake closes (then the head it returns may be after itself).
	WaitRev(ctx context.Context, after int64, wake <-chan struct{}) (int64, error)
	// ReadWatchEvents reads the events of revisions r.From.. (see mvcc).
	ReadWatchEvents(ctx context.Context, r mvcc.WatchRead) (mvcc.EventBatch, error)
}

var _ Source = (*mvcc.Store)(nil)

// Config tunes the hub; the zero value is usable.
type Config struct {
	Logger *zap.Logger
	// DispatchRevs bounds the revisions the hub reads per storage read.
	DispatchRevs int
	// CatchUpRevs bounds the revisions one catch-up round reads.
	CatchUpRevs int
	// ReadBytes bounds what one storage transaction of the hub or of a
	// catch-up reads (mvcc.WatchRead.MaxBytes): a revision log of large
	// values is read in many short transactions.
	ReadBytes int
	// StreamEntries and StreamBytes bound the event responses queued on one
	// stream (bytes approximate keys and values); a watcher whose stream is
	// full is lagging: it catches up from the revision log. One response is always accepted into
	// an empty queue, however large.
	StreamEntries int
	StreamBytes   int
	// StreamControl bounds the control responses (created, canceled) a
	// stream's receiver may queue before it waits for the sender.
	StreamControl int
	// RetryDelay is the pause after a storage error before retrying.
	RetryDelay time.Duration
	// Served is the process's response-header watermark (server/header).
	// With it, a progress request on a synced stream is answered at once,
	// from memory, when the hub has dispatched every revision the process
	// has told any client (Stream.RequestProgress); nil answers every
	// request only after reading the store's head.
	Served *progress.Served
	// SoleWriter says that no other process writes to the store (the
	// embedded backend, mvcc.Config.SoleWriter), so a client can know of
	// no revision this process did not tell it of, and an answer from
	// memory is final.
	// Otherwise (replicas on FoundationDB) the request still reads the
	// store's head after answering from memory, and a newer head gets a
	// second notification, as the answer without Served would carry.
	SoleWriter bool
	// Committed, on a store other processes write, is a watermark of
	// revisions this process learns are committed without reading the
	// store: the write owner's feed (server/commitfeed). The tail reads
	// them as soon as they rise, instead of after the store's change
	// notification (on FoundationDB a watch firing 10–20 ms after the
	// commit). It says nothing of what clients were told, so progress
	// answers do not use it.
	Committed *progress.Served
	// FeedGrace is how long a wait for the next revision that follows
	// one the owner's feed (Committed) told of first waits for the feed's
	// next news before it also sets up the store's change notification.
	// While the feed keeps coming, a follower's hub then never sets that
	// up — on FoundationDB a read of the head and a storage watch per
	// revision, most of a follower's CPU — at the price of noticing a
	// commit the feed does not carry (this or another replica's local
	// commit, cut off from the owner) up to FeedGrace late.
	FeedGrace time.Duration
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.DispatchRevs <= 0 {
		c.DispatchRevs = 256
	}
	if c.CatchUpRevs <= 0 {
		c.CatchUpRevs = 128
	}
	if c.ReadBytes <= 0 {
		c.ReadBytes = mvcc.DefaultWatchReadBytes
	}
	if c.StreamEntries <= 0 {
		c.StreamEntries = 4096
	}
	if c.StreamBytes <= 0 {
		c.StreamBytes = 16 << 20
	}
	if c.StreamControl <= 0 {
		c.StreamControl = 256
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = 50 * time.Millisecond
	}
	if c.FeedGrace <= 0 {
		c.FeedGrace = 50 * time.Millisecond
	}
}

// Hub is one process's watch hub.
type Hub struct {
	cfg    Config
	lg     *zap.Logger
	src    Source
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	rev  int64 // every revision <= rev has been dispatched
	head int64 // the newest committed revision the hub knows of
	// wake ends the tail's wait for the store's next commit notification
	// (learnHead), not its read of the head; nil while the tail is not
	// waiting, and called at most once.
	wake     func()
	advanced chan struct{} // closed and replaced whenever rev advances
	idx      *index
	streams  map[*Stream]struct{}                         // open streams
	waiting  map[*Stream]struct{}                         // streams with unanswered progress requests
	answered struct{ memory, afterRead, followUps int64 } // progress requests, by how they were answered
	reads    struct{ memory, storage int64 }              // the tail's reads of new revisions, by where they came from
	stopping bool
	groups   []*group   // dispatch scratch
	touched  []*Watcher // dispatch scratch
}

// New starts a hub at the store's current revision.
func New(ctx context.Context, src Source, cfg Config) (*Hub, error) {
	cfg.defaults()
	rev, _, err := src.Rev(ctx)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(context.Background())
	h := &Hub{
		cfg: cfg, lg: cfg.Logger, src: src, ctx: hctx, cancel: cancel,
		rev: rev, head: rev, advanced: make(chan struct{}), idx: newIndex(true), streams: map[*Stream]struct{}{}, waiting: map[*Stream]struct{}{},
	}
	h.wg.Add(1)
	go h.run()
	return h, nil
}

// Stop stops the hub and every goroutine it started. Streams stay usable
// but receive nothing more.
func (h *Hub) Stop() {
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// Rev returns the revision up to which every event has been dispatched.
func (h *Hub) Rev() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rev
}

// Stats is a snapshot of the hub's watchers and queues, for the metrics
// scrape.
type Stats struct {
	// Rev is the revision up to which events are dispatched; Head the
	// newest committed revision the hub knows of.
	Rev, Head int64
	// Watchers by state: synced, unsynced (catching up from the revision
	// log; lagging ones not counted), lagging (fell behind their stream,
	// etcd's victims).
	Synced, Unsynced, Lagging int
	Streams                   int
	// QueuedBytes is the approximate event bytes of the responses queued
	// on all streams.
	QueuedBytes int
	// Progress requests answered so far: from memory at once, after a
	// read of the head, and second notifications that followed an answer
	// from memory because the head was newer (Stream.RequestProgress).
	ProgressFromMemory, ProgressAfterRead, ProgressFollowUps int64
	// ReadsFromMemory and ReadsFromStorage count the tail's reads of new
	// revisions: answered by the store's log tail in memory (its own
	// commits, or the write owner's from its feed), or from storage.
	ReadsFromMemory, ReadsFromStorage int64
}

// Stats counts the hub's watchers.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := Stats{Rev: h.rev, Head: max(h.head, h.rev), Synced: h.idx.size, Streams: len(h.streams),
		ProgressFromMemory: h.answered.memory, ProgressAfterRead: h.answered.afterRead, ProgressFollowUps: h.answered.followUps,
		ReadsFromMemory: h.reads.memory, ReadsFromStorage: h.reads.storage}
	for st := range h.streams {
		for w := range st.unsynced {
			if w.lagging {
				s.Lagging++
			} else {
				s.Unsynced++
			}
		}
		_, b := st.Len()
		s.QueuedBytes += b
	}
	return s
}

// WaitCaughtUp returns once the hub has dispatched every revision the store
// had committed when it was called.
func (h *Hub) WaitCaughtUp(ctx context.Context) error {
	rev, _, err := h.src.Rev(ctx)
	if err != nil {
		return err
	}
	for {
		h.mu.Lock()
		done, ch := h.rev >= rev, h.advanced
		h.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("watch hub at revision %d, store at %d: %w", h.Rev(), rev, ctx.Err())
		case <-h.ctx.Done():
			return errors.New("watch hub stopped")
		}
	}
}

// setRev advances the dispatched revision. The caller holds mu.
func (h *Hub) setRev(rev int64) {
	if rev <= h.rev {
		return
	}
	h.rev = rev
	h.head = max(h.head, rev)
	close(h.advanced)
	h.advanced = make(chan struct{})
}

func (h *Hub) sleep() bool {
	t := time.NewTimer(h.cfg.RetryDelay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-h.ctx.Done():
		return false
	}
}

// run tails the revision log. Only this goroutine moves h.rev, so it reads
// it without the lock.
func (h *Hub) run() {
	defer h.wg.Done()
	head := h.rev
	for {
		if head <= h.rev {
			next, read, ok := h.awaitHead()
			if !ok {
				return
			}
			head = next
			if !read {
				continue
			}
		}
		var ok bool
		if head, ok = h.readBatch(head); !ok {
			return
		}
	}
}

// awaitHead waits for a revision past the hub's and returns the head;
// read says whether there are events to read up to it. With no synced
// watcher to hand events to, it skips reading them: a watcher that joins
// later starts after h.rev or catches up from the log itself, so moving
// h.rev loses nothing. ok is false once the hub stops.
func (h *Hub) awaitHead() (head int64, read, ok bool) {
	head, err := h.waitHead()
	if err != nil {
		if h.ctx.Err() != nil {
			return head, false, false
		}
		h.lg.Warn("watch hub: waiting for the next revision failed; retrying", zap.Error(err))
		return head, false, h.sleep()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.head = max(h.head, head)
	if h.idx.size > 0 {
		return head, true, true
	}
	h.setRev(head)
	for st := range h.waiting {
		h.answer(st)
	}
	return head, false, true
}

// waitHead waits for a commit past h.rev: the store's change notification,
// a newer head that a read outside the tail learned meanwhile (learnHead),
// or, on a replica, a rise of the process's Served or Committed watermark
// past the hub's head, whichever comes first.
func (h *Hub) waitHead() (int64, error) {
	h.mu.Lock()
	after := h.rev
	if h.head > after {
		defer h.mu.Unlock()
		return h.head, nil
	}
	wake := make(chan struct{})
	h.wake = func() { close(wake) }
	h.mu.Unlock()
	followed := func() {}
	ctx, cancel := context.WithCancel(h.ctx)
	if !h.cfg.SoleWriter {
		followed = h.followCommitted(ctx)
	}
	head, err := after, error(nil)
	if !h.feedCurrent(after) || !h.toldWithin(wake) {
		head, err = h.src.WaitRev(h.ctx, after, wake)
	}
	cancel()
	followed()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wake = nil
	if h.ctx.Err() == nil && h.head > max(head, after) {
		return h.head, nil
	}
	return head, err
}

// feedCurrent reports whether the owner's feed (Committed) has told of
// every revision up to rev: while it has, the next revision's news comes
// from the feed, and waiting for it costs no storage call. When the owner's
// answer to a forwarded write told of a revision first (Served), the feed's
// message of it is a moment behind, and the wait that follows still waits
// for the feed first. A process without a feed, or whose feed is behind,
// sets up the store's change notification at once.
func (h *Hub) feedCurrent(rev int64) bool {
	// A nil watermark's Load is 0.
	return !h.cfg.SoleWriter && h.cfg.Committed != nil && h.cfg.Committed.Load() >= rev
}

// toldWithin reports whether wake closes within FeedGrace: news of a
// commit from outside the store came.
func (h *Hub) toldWithin(wake <-chan struct{}) bool {
	t := time.NewTimer(h.cfg.FeedGrace)
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return false
	case <-h.ctx.Done():
		return false
	}
}

// followCommitted hands the hub, while ctx lasts, every revision the
// process tells a client of (Served) and every one the owner's feed says
// is committed (Committed): on a replica the owner's answer to a write
// this replica forwarded, and the feed's news of any commit, arrive before
// FoundationDB's watch fires here. It returns a function that waits for
// its goroutine, which ends with ctx; with neither watermark it starts
// none.
func (h *Hub) followCommitted(ctx context.Context) (wait func()) {
	served, committed := h.cfg.Served, h.cfg.Committed
	if served == nil && committed == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			// A nil watermark's Raised never closes and its Load is 0.
			sr, cr := served.Raised(), committed.Raised()
			h.mu.Lock()
			h.learnHead(max(served.Load(), committed.Load()))
			h.mu.Unlock()
			select {
			case <-sr:
			case <-cr:
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { <-done }
}

// learnHead records a committed revision that the tail did not read
// itself: one a progress request's read of the head found, one the
// process served, or one the owner's feed reported. Past what the hub
// knows, it ends the tail's wait at once: on a store other processes write, the change notification of
// their commits (on FoundationDB a watch firing, 10–20 ms on a small
// cluster) would otherwise hold every answer and event that waits for the
// hub that long. The caller holds mu.
func (h *Hub) learnHead(head int64) {
	if head <= h.head {
		return
	}
	h.head = head
	if h.wake != nil {
		h.wake()
		h.wake = nil
	}
}

// awaitFeed waits, on a follower whose feed from the owner (Committed)
// had told of every revision the hub dispatched, up to FeedGrace for the
// feed to tell of revision next as well, before the tail reads it. The
// owner's answer to a write this replica forwarded (Served) races the
// feed's message of the same commit, and when the answer wins, the
// revision is not yet in the store's memory: the read went to storage (on
// FoundationDB a read version and a read) for what the feed brings a
// moment later — a tenth of a follower's reads in make scale's reduced
// profile. A feed that is behind, or a process without one, waits for
// nothing. Only the tail's goroutine calls it.
func (h *Hub) awaitFeed(next int64) {
	c := h.cfg.Committed
	if !h.feedCurrent(next-1) || c.Load() >= next {
		return
	}
	t := time.NewTimer(h.cfg.FeedGrace)
	defer t.Stop()
	for {
		raised := c.Raised()
		if c.Load() >= next {
			return
		}
		select {
		case <-raised:
		case <-t.C:
			return
		case <-h.ctx.Done():
			return
		}
	}
}

// readBatch reads the next batch of the revision log, dispatches it and
// returns the head it saw (head again when nothing was read). ok is false
// once the hub stops.
func (h *Hub) readBatch(head int64) (int64, bool) {
	h.awaitFeed(h.rev + 1)
	h.mu.Lock()
	// Previous values are read only when a synced watcher wants them;
	// one that joins meanwhile catches up instead (dispatch).
	r := mvcc.WatchRead{From: h.rev + 1, MaxRevs: h.cfg.DispatchRevs, MaxBytes: h.cfg.ReadBytes, PrevKV: h.idx.prevKV > 0}
	h.mu.Unlock()
	b, err := h.src.ReadWatchEvents(h.ctx, r)
	if errors.Is(err, mvcc.ErrCompacted) {
		h.mu.Lock()
		h.compactedBehind(b.Compacted)
		h.mu.Unlock()
		return head, true
	}
	if err != nil {
		if h.ctx.Err() != nil {
			return head, false
		}
		h.lg.Warn("watch hub: reading the revision log failed; retrying", zap.Error(err))
		return head, h.sleep()
	}
	for _, re := range revEventsOf(b) {
		h.mu.Lock()
		h.dispatch(re)
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if b.Reads == 0 {
		h.reads.memory++
	} else {
		h.reads.storage++
	}
	h.head = max(h.head, b.Head)
	h.setRev(b.To)
	for st := range h.waiting {
		h.answer(st)
	}
	return b.Head, true
}

// dispatch hands one revision to the synced watchers. The caller holds mu.
func (h *Hub) dispatch(re *revEvents) {
	touched := h.touched[:0]
	for i, ev := range re.full {
		h.groups = h.idx.match(ev.PB.Kv.Key, h.groups[:0])
		for _, g := range h.groups {
			for _, w := range g.ws {
				if w.next > re.rev || w.filtered(ev.PB) {
					continue
				}
				if w.hitRev != re.rev {
					w.hitRev, w.hits = re.rev, w.hits[:0]
					touched = append(touched, w)
				}
				w.hits = append(w.hits, int32(i))
			}
		}
	}
	for _, w := range touched {
		if w.prevKV && !re.prevKV {
			// It joined after the read was planned without previous
			// values: it reads them unsynced.
			h.demote(w, re.rev, false)
			continue
		}
		evs := re.pick(w.hits, w.prevKV)
		r := Response{Kind: KindEvents, WatchID: w.id, Rev: re.rev, Events: evs, Fragment: w.fragment, size: eventsSize(evs)}
		if w.st.pushEvents(w, r) {
			w.next = re.rev + 1
			continue
		}
		h.demote(w, re.rev, true) // its stream queue is full
	}
	clear(touched)
	h.touched = touched[:0]
	clear(h.groups)
	h.setRev(re.rev)
}

// demote takes a synced watcher out of the index to catch up from rev:
// lagging when its stream queue is full (etcd's victims), or because the hub
// read rev without the previous values it needs. The caller holds mu.
func (h *Hub) demote(w *Watcher, rev int64, lagging bool) {
	h.idx.remove(w)
	w.next, w.lagging = rev, lagging
	h.addUnsynced(w)
}

// compactedBehind handles a compaction past the hub's position (the hub fell
// behind by a whole compaction window): synced watchers that still needed a
// compacted revision are canceled with compact_revision set, as etcd cancels
// an unsynced watcher, and the hub resumes at the compaction revision.
func (h *Hub) compactedBehind(compacted int64) {
	if compacted <= h.rev+1 {
		return
	}
	var dead []*Watcher
	h.idx.each(func(w *Watcher) {
		if max(w.next, h.rev+1) < compacted {
			dead = append(dead, w)
		}
	})
	for _, w := range dead {
		h.idx.remove(w)
		h.compact(w, compacted)
	}
	h.lg.Warn("watch hub fell behind a compaction", zap.Int64("hub-revision", h.rev), zap.Int64("compacted", compacted), zap.Int("canceled-watchers", len(dead)))
	h.setRev(compacted - 1)
}

// compact cancels w for compaction. The watcher stays registered on its
// stream, as in etcd, until the client cancels it. The caller holds mu and
// has taken w out of the index or the unsynced set.
func (h *Hub) compact(w *Watcher, compacted int64) {
	if w.state == stateUnsynced {
		delete(w.st.unsynced, w)
	}
	w.state = stateCompacted
	w.st.pushControl(Response{Kind: KindCompacted, WatchID: w.id, CompactRev: compacted, Canceled: true})
}

// addUnsynced puts w among its stream's unsynced watchers and makes sure
// the stream's catch-up goroutine runs. The caller holds mu.
func (h *Hub) addUnsynced(w *Watcher) {
	st := w.st
	w.state = stateUnsynced
	st.unsynced[w] = struct{}{}
	if st.catchingUp || h.stopping {
		return
	}
	st.catchingUp = true
	h.wg.Add(1)
	go h.catchUp(st)
}

// answer sends the progress responses a stream owes if it can. The caller
// holds mu.
func (h *Hub) answer(st *Stream) {
	if !st.reqs.Pending() {
		delete(h.waiting, st)
		return
	}
	if !st.closed {
		switch h.progressReady(st) {
		case progressWait:
			h.waiting[st] = struct{}{}
			return
		case progressSend:
			h.sendProgress(st, h.rev)
			return
		}
	}
	st.reqs.Take() // dropped, as etcd drops it
	delete(h.waiting, st)
}

// sendProgress queues the answers to a stream's pending progress requests
// at rev. The caller holds mu.
func (h *Hub) sendProgress(st *Stream, rev int64) {
	for range st.reqs.Take() {
		st.pushControl(Response{Kind: KindProgress, WatchID: InvalidWatchID, Rev: rev})
	}
	st.progressRev = max(st.progressRev, rev)
	delete(h.waiting, st)
}

type progressState int

const (
	progressSend progressState = iota
	progressWait
	progressDrop
)

// progressReady applies etcd's rule (progressIfSync) to a stream's pending
// requests: every watcher synced and none with a start revision above the
// revision the request saw. What etcd cannot be in (the hub behind the
// store, an unsynced watcher) waits; what etcd drops (no watchers, a
// compacted watcher still registered, a watcher waiting for a future
// revision) is dropped. The caller holds mu.
func (h *Hub) progressReady(st *Stream) progressState {
	return h.progressReadyAt(st, st.reqs.Target())
}

// progressReadyAt is progressReady for requests whose answer must carry at
// least target. The caller holds mu.
func (h *Hub) progressReadyAt(st *Stream, target int64) progressState {
	if len(st.watchers) == 0 {
		return progressDrop
	}
	need := target
	for _, w := range st.watchers {
		if w.state == stateCompacted || w.startRev > target {
			return progressDrop
		}
		need = max(need, w.createdRev)
	}
	if len(st.unsynced) > 0 || h.rev < need {
		return progressWait
	}
	return progressSend
}
