package watchhub

import (
	"bytes"
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// Watch ids with a meaning of their own (clientv3.AutoWatchID and
// clientv3.InvalidWatchID).
const (
	AutoWatchID    = 0
	InvalidWatchID = progress.InvalidWatchID
)

// Cancel reasons etcd's mvcc package reports for a failed create; clients see
// them in cancel_reason.
var (
	ErrEmptyRange  = errors.New("mvcc: watcher range is empty")
	ErrDuplicateID = errors.New("mvcc: duplicate watch ID provided on the WatchStream")
)

// Options describe one watcher. Key and End are normalised the way etcd's
// mvcc takes them: End nil for a single key, empty (non-nil) for every key
// from Key on.
type Options struct {
	ID             int64 // AutoWatchID: the stream assigns one
	Key, End       []byte
	StartRev       int64 // 0: from the next revision
	PrevKV         bool
	Fragment       bool
	ProgressNotify bool
	NoPut          bool
	NoDelete       bool
}

type watcherState uint8

const (
	stateSynced watcherState = iota
	stateUnsynced
	stateCompacted // canceled for compaction, still registered
	stateRemoved
)

// Watcher is one watch of a stream.
type Watcher struct {
	st         *Stream
	id         int64
	key, end   []byte
	startRev   int64
	createdRev int64
	prevKV     bool
	fragment   bool
	noPut      bool
	noDelete   bool

	// Guarded by the hub's mu.
	state   watcherState
	next    int64 // the lowest revision the watcher still needs
	lagging bool  // unsynced because its stream queue was full
	grp     *group
	gpos    int
	// Dispatch scratch, used by the hub goroutine under mu.
	hits   []int32
	hitRev int64
	// Catch-up scratch, used by the stream's catch-up goroutine while the
	// watcher is unsynced.
	cuEvents []*Event

	// Guarded by the stream's qmu.
	gone    bool  // canceled or closed: its queued-to-be responses are dropped
	lastRev int64 // newest event revision queued (invariant checks)
}

func (w *Watcher) filtered(ev *mvccpb.Event) bool {
	switch ev.Type {
	case mvccpb.Event_PUT:
		return w.noPut
	case mvccpb.Event_DELETE:
		return w.noDelete
	}
	return false
}

func (w *Watcher) holds(key []byte) bool {
	switch {
	case w.end == nil:
		return bytes.Equal(key, w.key)
	case len(w.end) == 0:
		return bytes.Compare(key, w.key) >= 0
	default:
		return bytes.Compare(key, w.key) >= 0 && bytes.Compare(key, w.end) < 0
	}
}

// Kind tells a stream's sender what a Response is.
type Kind uint8

// Response kinds.
const (
	KindEvents    Kind = iota // events of one watcher
	KindCreated               // a watcher was created
	KindRejected              // a create failed: created and canceled, watch id -1
	KindCanceled              // a watcher was canceled by the client
	KindCompacted             // a watcher was canceled because its start is compacted
	KindProgress              // a progress notification
)

// Response is one WatchResponse to send, minus the header's member fields.
type Response struct {
	Kind         Kind
	WatchID      int64
	Rev          int64 // header revision
	Events       []*Event
	Created      bool
	Canceled     bool
	CompactRev   int64
	CancelReason string
	// Fragment is the watcher's fragment option (events responses).
	Fragment bool
	// ProgressNotify is the watcher's progress_notify option (created).
	ProgressNotify bool
	size           int
}

// Stream is one gRPC watch stream's share of the hub: its watchers and the
// FIFO queue of responses its sender drains. The receiver calls Watch,
// Cancel and RequestProgress; the sender calls Pop and WatcherProgress.
type Stream struct {
	h *Hub

	// Guarded by the hub's mu.
	watchers   map[int64]*Watcher
	nextID     int64
	unsynced   map[*Watcher]struct{}
	catchingUp bool
	// headCheck: a goroutine reads the store's head after answers from
	// memory (Stream.RequestProgress); headAgain: a request arrived after
	// it started reading, so it reads again.
	headCheck bool
	headAgain bool
	reqs      progress.Requests
	// progressRev is the highest revision a progress answer promised.
	progressRev int64
	closed      bool

	queue
}

// NewStream opens a stream.
func (h *Hub) NewStream() *Stream {
	st := &Stream{
		h:        h,
		watchers: map[int64]*Watcher{},
		unsynced: map[*Watcher]struct{}{},
		queue:    newQueue(h.cfg),
	}
	h.mu.Lock()
	h.streams[st] = struct{}{}
	h.mu.Unlock()
	return st
}

// Reject queues the answer to a create request that fails before reaching
// the hub (etcd's v3rpc checks): created and canceled, watch id -1, header
// at the current revision.
func (st *Stream) Reject(ctx context.Context, reason string) error {
	rev, _, err := st.h.src.Rev(ctx)
	if err != nil {
		return err
	}
	st.reject(max(rev, st.h.Rev()), reason)
	return nil
}

func (st *Stream) reject(rev int64, reason string) {
	st.pushControl(Response{Kind: KindRejected, WatchID: InvalidWatchID, Rev: rev, Created: true, Canceled: true, CancelReason: reason})
}

// Watch creates a watcher and queues its created response (or the reason it
// failed). The error is a storage error, which ends the stream.
func (st *Stream) Watch(ctx context.Context, o Options) error {
	h := st.h
	cur, compacted, err := h.src.Rev(ctx)
	if err != nil {
		return err
	}
	if len(o.End) != 0 && bytes.Compare(o.Key, o.End) >= 0 {
		st.reject(max(cur, h.Rev()), ErrEmptyRange.Error())
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hdr := max(cur, h.rev)
	if st.closed {
		return nil
	}
	id := o.ID
	if id == AutoWatchID {
		for st.watchers[st.nextID] != nil {
			st.nextID++
		}
		id = st.nextID
		st.nextID++
	} else if st.watchers[id] != nil {
		st.reject(hdr, ErrDuplicateID.Error())
		return nil
	}
	w := &Watcher{
		st: st, id: id, key: o.Key, end: o.End, startRev: o.StartRev, createdRev: hdr,
		prevKV: o.PrevKV, fragment: o.Fragment, noPut: o.NoPut, noDelete: o.NoDelete,
	}
	st.watchers[id] = w
	st.pushControl(Response{Kind: KindCreated, WatchID: id, Rev: hdr, Created: true, ProgressNotify: o.ProgressNotify})
	switch {
	case o.StartRev > 0 && o.StartRev < compacted:
		h.compact(w, compacted)
	case o.StartRev == 0:
		w.next = hdr + 1
		h.idx.add(w)
	case o.StartRev > h.rev:
		w.next = o.StartRev
		h.idx.add(w)
	default:
		w.next = o.StartRev
		h.addUnsynced(w)
	}
	return nil
}

// Cancel cancels a watcher and queues the canceled response; an unknown id
// gets no response, as in etcd.
func (st *Stream) Cancel(ctx context.Context, id int64) error {
	h := st.h
	cur, _, err := h.src.Rev(ctx)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	w := st.watchers[id]
	if w == nil || st.closed {
		return nil
	}
	delete(st.watchers, id)
	h.detach(w)
	st.qmu.Lock()
	w.gone = true
	st.pushControlLocked(Response{Kind: KindCanceled, WatchID: id, Rev: max(cur, h.rev), Canceled: true})
	st.qmu.Unlock()
	if st.reqs.Pending() {
		h.answer(st)
	}
	return nil
}

// detach takes w out of the hub. The caller holds mu.
func (h *Hub) detach(w *Watcher) {
	switch w.state {
	case stateSynced:
		h.idx.remove(w)
	case stateUnsynced:
		delete(w.st.unsynced, w)
	}
	w.state = stateRemoved
}

// RequestProgress handles a WatchProgressRequest: the answer (watch id -1) is
// queued once every watcher of the stream has been sent every event up to
// a revision no lower than any this process has told a client of, and, on a
// store other processes write too, a notification follows at the store's
// revision when the request arrived if that is newer; see
// Hub.progressReady for when it is dropped instead.
//
// When the hub has dispatched every revision the process has put in a
// response header (Config.Served), the answer is queued at once from
// memory, as etcd answers; kube-apiserver's consistent reads wait for one
// after each Range, so that is most of their latency. Otherwise, or to
// learn of revisions other processes committed, the request reads, in one
// transaction, the store's head and the keys of the revisions the hub has
// not dispatched yet: when none of them concerns the stream's (synced)
// watchers, the answer is queued at the head at once rather than behind
// the hub's reading and dispatching of those revisions — work for other
// streams, and on the embedded store the commit of a write this stream
// does not watch.
func (st *Stream) RequestProgress(ctx context.Context) error {
	h := st.h
	h.mu.Lock()
	if st.closed || len(st.watchers) == 0 {
		h.mu.Unlock()
		return nil
	}
	if h.answerFromMemory(st) > 0 {
		if !h.cfg.SoleWriter {
			h.checkHead(st)
		}
		h.mu.Unlock()
		return nil
	}
	from := h.rev + 1
	h.mu.Unlock()
	b, err := h.readHead(ctx, from)
	if err != nil && !errors.Is(err, mvcc.ErrCompacted) {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.answerAtHead(st, b, err == nil, true)
	return nil
}

// readHead reads the store's head and the keys of the revisions from on,
// within the bounds of an answer that does not wait for the hub.
func (h *Hub) readHead(ctx context.Context, from int64) (mvcc.EventBatch, error) {
	return h.src.ReadWatchEvents(ctx, mvcc.WatchRead{From: from, KeysOnly: true, NoSplit: true, MaxBytes: progressProbeBytes, FromStorage: true})
}

// answerAtHead answers a stream's progress request after a read of the
// head (b; whole says the read of the revisions after the hub's succeeded):
// at b.Head at once when none of those revisions is for the stream, else
// when the hub has dispatched them. A request answered from memory already
// (owed false) needs another answer only for a head newer than any the
// stream was promised. The caller holds mu.
func (h *Hub) answerAtHead(st *Stream, b mvcc.EventBatch, whole, owed bool) {
	h.learnHead(b.Head)
	if st.closed || len(st.watchers) == 0 || (!owed && b.Head <= st.progressRev) {
		return
	}
	if owed {
		h.answered.afterRead++
	} else {
		h.answered.followUps++
	}
	st.reqs.Add(b.Head)
	if whole && h.progressReady(st) == progressWait && h.quietThrough(st, b) {
		h.sendProgress(st, b.Head)
		return
	}
	h.answer(st)
}

// checkHead reads the store's head after an answer from memory, on a store
// other processes write, off the stream's receive path: one goroutine per
// stream at a time, which reads again if another request came meanwhile
// (its answer needs a head read after it arrived). The caller holds mu.
func (h *Hub) checkHead(st *Stream) {
	if st.headCheck {
		st.headAgain = true
		return
	}
	if h.stopping {
		return
	}
	st.headCheck = true
	h.wg.Add(1)
	go h.headChecks(st)
}

func (h *Hub) headChecks(st *Stream) {
	defer h.wg.Done()
	for {
		h.mu.Lock()
		if st.closed || h.stopping {
			st.headCheck, st.headAgain = false, false
			h.mu.Unlock()
			return
		}
		from := h.rev + 1
		h.mu.Unlock()
		b, err := h.readHead(h.ctx, from)
		h.mu.Lock()
		if err == nil || errors.Is(err, mvcc.ErrCompacted) {
			h.answerAtHead(st, b, err == nil, false)
		} else if h.ctx.Err() == nil {
			// The answer from memory stands, as an etcd follower's does;
			// a client that needs a newer one asks again.
			h.lg.Debug("watch hub: reading the head for a progress answer failed", zap.Error(err))
		}
		again := st.headAgain
		st.headAgain = false
		st.headCheck = again
		h.mu.Unlock()
		if !again {
			return
		}
	}
}

// answerFromMemory answers a progress request at once at the hub's
// revision if that tells no client of this process anything older than it
// was told: the hub has dispatched every revision in a response header
// (Served) and never promised more, no earlier request is pending, and
// etcd's rule lets the stream be answered at h.rev. It returns the
// revision answered, 0 if it did not answer. The caller holds mu.
func (h *Hub) answerFromMemory(st *Stream) int64 {
	if h.cfg.Served == nil || st.reqs.Pending() || h.rev < st.progressRev || h.rev < h.cfg.Served.Load() {
		return 0
	}
	if h.progressReadyAt(st, h.rev) != progressSend {
		return 0
	}
	st.reqs.Add(h.rev)
	h.sendProgress(st, h.rev)
	h.answered.memory++
	return h.rev
}

// Bounds of the answer that does not wait for the hub: the log bytes it
// reads, and the watcher-event comparisons it makes under the hub's lock.
// Past them the request waits for the hub.
const (
	progressProbeBytes  = 64 << 10
	progressProbeChecks = 16 << 10
)

// quietThrough reports whether the stream may be told now that it has
// every event up to b.Head although the hub has dispatched only up to
// h.rev: no watcher is unsynced, b holds every revision after h.rev up
// to b.Head, that is enough for every pending request and watcher, and no
// event of those revisions is for a watcher of the stream. The caller
// holds mu.
func (h *Hub) quietThrough(st *Stream, b mvcc.EventBatch) bool {
	if len(st.unsynced) > 0 || b.To < b.Head || b.From > h.rev+1 {
		return false
	}
	need := st.reqs.Target()
	for _, w := range st.watchers {
		need = max(need, w.createdRev)
	}
	if need > b.Head {
		return false
	}
	checks := 0
	for _, re := range b.Revs {
		if re.Rev <= h.rev {
			continue
		}
		checks += len(re.Events) * len(st.watchers)
		if checks > progressProbeChecks {
			return false
		}
		for _, ev := range re.Events {
			for _, w := range st.watchers {
				if w.next <= re.Rev && w.holds(ev.Kv.Key) && !w.filtered(ev) {
					return false
				}
			}
		}
	}
	return true
}

// WatcherProgress queues periodic progress notifications for the given
// watchers, each under its own id, for those that are synced and past their
// start revision; the others are skipped, as in etcd.
func (st *Stream) WatcherProgress(ids []int64) {
	if len(ids) == 0 {
		return
	}
	h := st.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rev < st.progressRev {
		// A progress answer got ahead of the hub; a lower revision now
		// would take the client's view back. The next tick sends it.
		return
	}
	for _, id := range ids {
		w := st.watchers[id]
		if w == nil || w.state != stateSynced || !progress.Eligible(h.rev, w.startRev, w.createdRev) {
			continue
		}
		st.pushControl(Response{Kind: KindProgress, WatchID: id, Rev: h.rev})
	}
}

// Close removes every watcher of the stream from the hub and drops what is
// still queued. The sender's Done channel closes.
func (st *Stream) Close() {
	h := st.h
	h.mu.Lock()
	if !st.closed {
		st.closed = true
		for _, w := range st.watchers {
			h.detach(w)
		}
		clear(st.watchers)
		clear(st.unsynced)
		st.reqs.Take()
		delete(h.waiting, st)
		delete(h.streams, st)
	}
	h.mu.Unlock()
	st.closeQueue()
}
