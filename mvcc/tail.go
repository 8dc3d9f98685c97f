package mvcc

import (
	"bytes"
	"context"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The tail of the revision log, in memory.
//
// A watch hub learns of every revision by reading it back from the log
// after it commits: on FoundationDB the head, then the log parts and the
// versions they name — two or three transactions for what the process
// that wrote the revision had in hand a moment before, and on a host where
// every transaction costs the FoundationDB client a dozen thread wake-ups,
// most of the CPU a put costs. So the store keeps the revisions its own
// sequencer committed most recently, as ReadWatchEvents returns them, and
// answers reads of them from memory, and WaitRev learns of them without
// reading the head.
//
// What it holds is exactly what the log holds:
//   - a revision enters only when the run of the batch that wrote it
//     committed (revision.Decider); a batch found committed by a replay
//     after commit_unknown_result is not taken, since what landed is what
//     an earlier run evaluated, possibly differently; on a replica that
//     follows the write owner's commit feed, the owner's revisions as the
//     owner's tail held them (Store.Hold);
//   - one request writes one revision, whole, so a held revision has every
//     event of its revision;
//   - revisions it does not hold — another process's, a staged request's,
//     a replayed batch's — are read from storage: a read from memory stops
//     at the first gap;
//   - a previous value the write did not read, whose own revision is no
//     longer held, is not known: a read that wants previous values stops
//     before that revision;
//   - it serves nothing at or below the newest compaction revision it knows
//     of: physical compaction may already have removed a previous version
//     that storage would then leave out. Compactions of other processes
//     are learned from the next read of storage or the owner's feed, so
//     reads that must see every compaction acknowledged before them — a
//     watcher catching up from a past revision — and the store's head —
//     a progress answer — read storage (WatchRead.FromStorage). The watch
//     hub's reads of new revisions for its synced watchers come from here:
//     those, like etcd's synced watchers, get every event whatever a
//     compaction since removed.
//
// It is bounded by bytes (Config.LogTailBytes); the oldest revisions go
// first.
type logTail struct {
	maxBytes int

	mu   sync.Mutex
	revs []tailRev // ascending revisions, gaps possible; guarded by mu
	size int       // bytes of revs; guarded by mu
	// latest knows the values held revisions put, for the previous values
	// of later writes (latest.go). Guarded by mu.
	latest *latestValues
	// compacted is the newest compaction revision the store has seen;
	// committed the newest revision its sequencer committed, which wrote
	// committedHead to the head key at committedAt. Guarded by mu.
	compacted, committed int64
	committedHead        []byte
	committedAt          time.Time
	// run is what the sequencer's current run wrote, taken in when it
	// commits; inRun says a run has begun and is not decided. Guarded by
	// mu.
	run          []tailRev
	runCompacted int64
	inRun        bool
	// decided is closed and replaced whenever a run is decided. Guarded by
	// mu.
	decided chan struct{}
}

// tailRev is one held revision.
type tailRev struct {
	rev    int64
	events []tailEvent
	// size is what it holds in bytes; keysSize what a keys-only read of
	// it weighs.
	size, keysSize int
	// prevUnknown: an event's key existed before, but its previous value
	// is not known.
	prevUnknown bool
	changes     []change // in a run, until it commits
}

type tailEvent struct {
	typ    mvccpb.Event_EventType
	kv     *mvccpb.KeyValue // never modified once held
	prevKV *mvccpb.KeyValue // nil if the key did not exist before
}

// tailEventOverhead is what a held event costs besides its keys and values.
const tailEventOverhead = 160

// newLogTail holds up to maxBytes of revisions, and up to valueBytes of
// the values they put.
func newLogTail(maxBytes, valueBytes int) *logTail {
	return &logTail{maxBytes: maxBytes, latest: newLatestValues(valueBytes), decided: make(chan struct{})}
}

// enabled reports whether the tail holds anything at all.
func (t *logTail) enabled() bool { return t.maxBytes > 0 }

// beginRun starts a run of a batch (the Applier's Begin): what an earlier
// run wrote did not commit.
func (t *logTail) beginRun() {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.run, t.runCompacted, t.inRun = t.run[:0], 0, true
}

// wrote records that the current run writes changes as revision rev.
func (t *logTail) wrote(rev int64, changes []change) {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.run = append(t.run, tailRev{rev: rev, changes: changes})
}

// compactedTo records that the current run requests compaction at rev.
func (t *logTail) compactedTo(rev int64) {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.runCompacted = max(t.runCompacted, rev)
}

// decide ends the current run at now; if it committed, its revisions are
// held, and head is what it wrote to the head key (nil if nothing).
func (t *logTail) decide(committed bool, head []byte, now time.Time) {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if committed {
		for i := range t.run {
			t.take(t.run[i].rev, t.run[i].changes)
		}
		if n := len(t.run); n > 0 && t.run[n-1].rev > t.committed {
			t.committed, t.committedHead, t.committedAt = t.run[n-1].rev, head, now
		}
		t.learnCompacted(t.runCompacted)
	}
	clear(t.run)
	t.run, t.inRun = t.run[:0], false
	close(t.decided)
	t.decided = make(chan struct{})
}

// take holds revision rev, whose changes a committed run wrote. The caller
// holds mu.
func (t *logTail) take(rev int64, changes []change) {
	if n := len(t.revs); n > 0 && t.revs[n-1].rev >= rev {
		return // not ascending: never the case for one sequencer
	}
	tr := tailRev{rev: rev, events: make([]tailEvent, len(changes))}
	for i, c := range changes {
		key := bytes.Clone(c.key)
		ev := tailEvent{typ: mvccpb.PUT}
		if c.meta.Tombstone {
			ev.typ = mvccpb.DELETE
			ev.kv = &mvccpb.KeyValue{Key: key, ModRevision: rev}
		} else {
			ev.kv = &mvccpb.KeyValue{Key: key, CreateRevision: c.meta.CreateRev, ModRevision: rev,
				Version: c.meta.Version, Value: bytes.Clone(c.value), Lease: c.meta.Lease}
		}
		if c.prev != nil {
			p := c.prev.meta
			ev.prevKV = &mvccpb.KeyValue{Key: key, CreateRevision: p.CreateRev, ModRevision: p.ModRev, Version: p.Version, Lease: p.Lease}
			switch v, ok := t.latest.get(key, p.ModRev); {
			case c.prev.has:
				ev.prevKV.Value = bytes.Clone(c.prev.value)
			case ok:
				ev.prevKV.Value = v
			default:
				tr.prevUnknown = true
			}
		}
		t.learnValue(ev)
		tr.size += tailEventOverhead + 2*len(key) + len(ev.kv.Value) + len(ev.prevKV.GetValue())
		tr.keysSize += tailEventOverhead + len(key)
		tr.events[i] = ev
	}
	t.revs = append(t.revs, tr)
	t.size += tr.size
	for t.size > t.maxBytes && len(t.revs) > 0 {
		t.dropOldest()
	}
}

// learnValue records the value ev put, or that it deleted its key. The
// caller holds mu.
func (t *logTail) learnValue(ev tailEvent) {
	if ev.typ == mvccpb.PUT {
		t.latest.put(ev.kv.Key, ev.kv.ModRevision, ev.kv.Value)
	} else {
		t.latest.forget(ev.kv.Key)
	}
}

// find returns the index of revision rev in revs. The caller holds mu.
func (t *logTail) find(rev int64) (int, bool) {
	i := sort.Search(len(t.revs), func(i int) bool { return t.revs[i].rev >= rev })
	return i, i < len(t.revs) && t.revs[i].rev == rev
}

func (t *logTail) dropOldest() {
	t.size -= t.revs[0].size
	t.revs[0] = tailRev{}
	t.revs = t.revs[1:]
	if len(t.revs) == 0 {
		t.revs = nil // let the backing array go
	}
}

// learnCompacted records a compaction revision the store has seen and
// drops what it makes unservable. The caller holds mu.
func (t *logTail) learnCompacted(rev int64) {
	if rev <= t.compacted {
		return
	}
	t.compacted = rev
	for len(t.revs) > 0 && t.revs[0].rev <= rev {
		t.dropOldest()
	}
}

// sawCompacted records a compaction revision a read of storage found.
func (t *logTail) sawCompacted(rev int64) {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.learnCompacted(rev)
}

// committedRev is the newest revision this store's sequencer committed.
func (t *logTail) committedRev() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.committed
}

// headAt returns the head key's value as this store's sequencer wrote it
// at revision rev, if rev is the newest it committed.
func (t *logTail) headAt(rev int64) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rev != t.committed || t.committedHead == nil {
		return nil, false
	}
	return t.committedHead, true
}

// awaitCommitPast waits, while this store commits (its newest commit at
// most active before now), up to grace for one past after, and returns
// its revision; ok is false when there is none, or when wake closes or ctx
// ends first.
func (t *logTail) awaitCommitPast(ctx context.Context, after int64, now time.Time, active, grace time.Duration, wake <-chan struct{}) (rev int64, ok bool) {
	t.mu.Lock()
	rev, decided, last := t.committed, t.decided, t.committedAt
	t.mu.Unlock()
	if rev > after || !t.enabled() || grace <= 0 || last.IsZero() || now.Sub(last) > active {
		return rev, rev > after
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		select {
		case <-decided:
		case <-timer.C:
			return 0, false
		case <-wake:
			return 0, false
		case <-ctx.Done():
			return 0, false
		}
		t.mu.Lock()
		rev, decided = t.committed, t.decided
		t.mu.Unlock()
		if rev > after {
			return rev, true
		}
	}
}

// running returns, while a run of a batch is undecided, a channel closed
// when it is decided; nil otherwise.
func (t *logTail) running() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.inRun {
		return nil
	}
	return t.decided
}

// read answers r from memory, as ReadWatchEvents would from storage, if
// the tail holds r.From: whole revisions from r.From to the first gap,
// within r's bounds and at least one. ok is false when it holds nothing
// to start with.
func (t *logTail) read(r WatchRead) (b EventBatch, ok bool) {
	if !t.enabled() {
		return EventBatch{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.From <= t.compacted {
		return EventBatch{}, false
	}
	i, ok := t.find(r.From)
	if !ok {
		return EventBatch{}, false
	}
	b = EventBatch{From: r.From, To: r.From - 1, PrevKV: r.PrevKV, Compacted: t.compacted}
	used := 0
	for ; i < len(t.revs) && t.serves(&t.revs[i], r, b.To+1, used); i++ {
		tr := &t.revs[i]
		b.Revs = append(b.Revs, tr.revisionEvents(r))
		b.To, used = tr.rev, used+tr.weight(r)
	}
	if b.To < r.From {
		return EventBatch{}, false
	}
	b.Head = max(t.committed, b.To)
	return b, true
}

// serves reports whether a read r that has taken used bytes so far goes on
// with tr, which must be revision next.
func (t *logTail) serves(tr *tailRev, r WatchRead, next int64, used int) bool {
	switch {
	case tr.rev != next:
		return false // a gap: storage has it
	case r.UpTo > 0 && tr.rev > r.UpTo, r.MaxRevs > 0 && tr.rev >= r.From+int64(r.MaxRevs):
		return false
	case r.PrevKV && !r.KeysOnly && tr.prevUnknown:
		return false
	}
	return used == 0 || used+tr.weight(r) <= r.MaxBytes
}

// weight is what tr counts against a read's budget.
func (tr *tailRev) weight(r WatchRead) int {
	if r.KeysOnly {
		return tr.keysSize
	}
	return tr.size
}

// revisionEvents is tr as a read r returns it: new Event values (the
// KeyValues they point to are shared and never modified).
func (tr *tailRev) revisionEvents(r WatchRead) RevisionEvents {
	re := RevisionEvents{Rev: tr.rev, Events: make([]*mvccpb.Event, len(tr.events))}
	for i, ev := range tr.events {
		e := &mvccpb.Event{Type: ev.typ, Kv: ev.kv}
		switch {
		case r.KeysOnly:
			e.Kv = &mvccpb.KeyValue{Key: ev.kv.Key, ModRevision: ev.kv.ModRevision}
		case r.PrevKV:
			e.PrevKv = ev.prevKV
		}
		re.Events[i] = e
	}
	return re
}

// hold takes revisions another process committed (the write owner's, from
// its own tail: server/commitfeed), with every previous value, and the
// compaction revision that process knew of. Revisions at or below the
// newest held are left out: the tail holds ascending revisions only.
func (t *logTail) hold(revs []RevisionEvents, compacted int64) {
	if !t.enabled() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.learnCompacted(compacted)
	for _, re := range revs {
		if n := len(t.revs); (n > 0 && t.revs[n-1].rev >= re.Rev) || re.Rev <= t.compacted || len(re.Events) == 0 {
			continue
		}
		tr := tailRev{rev: re.Rev, events: make([]tailEvent, len(re.Events))}
		for i, ev := range re.Events {
			tr.events[i] = tailEvent{typ: ev.Type, kv: ev.Kv, prevKV: ev.PrevKv}
			t.learnValue(tr.events[i])
			tr.size += tailEventOverhead + 2*len(ev.Kv.GetKey()) + len(ev.Kv.GetValue()) + len(ev.PrevKv.GetValue())
			tr.keysSize += tailEventOverhead + len(ev.Kv.GetKey())
		}
		t.revs = append(t.revs, tr)
		t.size += tr.size
		for t.size > t.maxBytes && len(t.revs) > 0 {
			t.dropOldest()
		}
	}
}

// knownCompacted is the newest compaction revision the tail knows of.
func (t *logTail) knownCompacted() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.compacted
}
