package mvcc

import (
	"context"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// WatchRead is one ReadWatchEvents request.
type WatchRead struct {
	// From is the first revision to read.
	From int64
	// UpTo is the last revision to read; 0 means up to the head.
	UpTo int64
	// MaxRevs bounds the revisions one call returns; 0 means no bound.
	MaxRevs int
	// MaxBytes is the read budget of one storage transaction (keys, log
	// parts, version records and values); 0 means DefaultWatchReadBytes.
	MaxBytes int
	// PrevKV resolves the previous version of every event's key (etcd's
	// prev_kv); without it events carry no PrevKv and no previous value is
	// read.
	PrevKV bool
	// KeysOnly reads the log alone: events carry their type and a KeyValue
	// with only Key and ModRevision set.
	KeysOnly bool
	// NoSplit ends the batch before a first revision larger than the
	// budget instead of reading it in several transactions: the batch is
	// then empty with To < Head.
	NoSplit bool
	// FromStorage reads storage, never the log's tail in memory, so that
	// the batch's Head and Compacted are the store's as of a time after the
	// call began: a watch progress answer must carry a head no older than
	// the store's when it was asked for, and a watcher catching up from a
	// past revision must be refused if a compaction acknowledged before it
	// started passed that revision. From the tail, Head and Compacted are
	// only the newest the tail knows of.
	FromStorage bool
}

// DefaultWatchReadBytes is the read budget of one watch-log transaction. It
// keeps a transaction short on FoundationDB, whatever the size of the
// values: a revision log of many large values is read in many transactions,
// never in one that could outlive the 5 s limit and be retried forever.
const DefaultWatchReadBytes = 1 << 20

// EventBatch is what ReadWatchEvents returns: the events of the revisions
// From..To (To included; revisions without a log entry have no element in
// Revs), with the head and compacted revisions the reads saw — from the
// log's tail in memory (Reads 0), the newest revision and compaction the
// tail knows of, which storage may have passed (WatchRead.FromStorage).
type EventBatch struct {
	Revs      []RevisionEvents
	From, To  int64
	Head      int64
	Compacted int64
	// PrevKV says whether events carry PrevKv (WatchRead.PrevKV).
	PrevKV bool
	// Reads is the number of storage transactions the batch took: more
	// than one only for a revision larger than the budget.
	Reads int
}

// ReadWatchEvents reads the log of the revisions from r.From on, bounded by
// r.UpTo, r.MaxRevs and the head, in storage transactions that each read
// about r.MaxBytes. It returns whole revisions only: when budget runs out
// after at least one revision it stops there, and a first revision larger
// than the budget is read in as many transactions as it needs — a committed
// revision's log and versions never change until compaction, which each
// transaction checks. A From (or, for a revision read in several
// transactions, that revision) below the compacted revision fails with
// ErrCompacted; b.Compacted then says where compaction is. A From past the
// head returns an empty batch with To = From-1.
func (s *Store) ReadWatchEvents(ctx context.Context, r WatchRead) (EventBatch, error) {
	if r.MaxBytes <= 0 {
		r.MaxBytes = DefaultWatchReadBytes
	}
	if !r.FromStorage {
		if b, ok := s.tail.read(r); ok {
			if invariants {
				checkWatchBatch(b)
				s.checkTailRead(ctx, r, b)
			}
			return b, nil
		}
	}
	b, err := s.readWatchEvents(ctx, r)
	s.tail.sawCompacted(b.Compacted)
	return b, err
}

// readWatchEvents is ReadWatchEvents from storage.
func (s *Store) readWatchEvents(ctx context.Context, r WatchRead) (EventBatch, error) {
	c := watchCall{s: s, req: r, pos: logPos{rev: r.From}, to: -1}
	c.b = EventBatch{From: r.From, To: r.From - 1, PrevKV: r.PrevKV}
	for {
		var t *txRead
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			t = c.newTx(tx)
			return t.run()
		})
		c.b.Reads++
		if t != nil {
			c.b.Head, c.b.Compacted = max(c.b.Head, t.head), max(c.b.Compacted, t.compacted)
		}
		if err != nil {
			return c.b, err
		}
		if c.absorb(t) {
			if invariants {
				checkEventsAtOrBelow(c.b.Head, c.b.Revs)
				checkWatchBatch(c.b)
			}
			return c.b, nil
		}
	}
}

// watchSizes are running averages of what watch-log reads meet, so that
// each read step asks for about as much as its remaining budget holds: many
// small events in one round trip, one large value at a time.
type watchSizes struct {
	event atomic.Int64 // bytes read per event (version records and values)
	part  atomic.Int64 // bytes per log part
}

// Before anything was measured the averages assume the worst an event (a
// value and a previous value of storage.MaxValueSize each in their first
// chunk) and a log part can be, so a store's first reads start small; a few
// events later the averages are the workload's. A step reads at most
// maxStepEvents version records and maxStepParts log parts, so one
// transaction reads at most about its budget, plus one step's version
// records, plus the values of one event.
const (
	defaultEventBytes = 2 * storage.MaxValueSize
	defaultPartBytes  = logPartBytes
	maxStepEvents     = 64
	maxStepParts      = 256
	eventOverhead     = 64
)

func (w *watchSizes) eventBytes() int { return avgOr(&w.event, defaultEventBytes) }
func (w *watchSizes) partBytes() int  { return avgOr(&w.part, defaultPartBytes) }

func avgOr(a *atomic.Int64, d int) int {
	if v := a.Load(); v > 0 {
		return int(v)
	}
	return d
}

// observe folds a sample into an average (weight 1/4). Concurrent readers
// may lose each other's samples, which only makes the average less recent.
func observe(a *atomic.Int64, d, sample int) {
	old := avgOr(a, d)
	a.Store(int64(max(1, old+(sample-old)/4)))
}

// logPos is where a watch-log read resumes: skip events into log part part
// of revision rev.
type logPos struct {
	rev  int64
	part int
	skip int
}

// logRef is one event of the log, decoded but not resolved yet.
type logRef struct {
	pos logPos // pos.skip is the event's index in its part
	ev  logEvent
}

// watchCall is one ReadWatchEvents call: what its transactions have read.
type watchCall struct {
	s   *Store
	req WatchRead
	b   EventBatch
	to  int64 // the last revision the call reads; -1 until the first transaction
	pos logPos
	// partial is the first revision of the call while it is still being
	// read, over several transactions.
	partial *RevisionEvents
}

func (c *watchCall) newTx(tx storage.ReadTx) *txRead {
	return &txRead{tx: tx, c: c, pos: c.pos, partsPos: c.pos, to: c.to}
}

// absorb takes a committed transaction's reads into the batch and reports
// whether the call is done.
func (c *watchCall) absorb(t *txRead) bool {
	c.to = t.to
	if t.to < c.req.From {
		return true // nothing to read
	}
	revs := t.revs
	done := t.exhausted()
	complete := len(revs)
	if !done && complete > 0 && revs[complete-1].Rev == t.pos.rev {
		complete-- // the last revision continues after t.pos
	}
	if complete == 0 && !done && c.req.NoSplit {
		return true // the first revision does not fit one transaction
	}
	if c.partial != nil {
		if len(revs) > 0 && revs[0].Rev == c.partial.Rev {
			c.partial.Events = append(c.partial.Events, revs[0].Events...)
			revs[0] = *c.partial
		} else {
			// The last transaction ended exactly at the partial
			// revision's last event: this one found nothing more of it.
			revs = append([]RevisionEvents{*c.partial}, revs...)
			complete++
		}
		c.partial = nil
	}
	c.b.Revs = append(c.b.Revs, revs[:complete]...)
	switch {
	case done:
		c.b.To = t.to
		return true
	case len(c.b.Revs) > 0:
		// Whole revisions only: a revision begun in this transaction is
		// read again, from its start, by the next call.
		c.b.To = t.pos.rev - 1
		return true
	}
	p := revs[0]
	c.partial = &p
	c.pos = t.pos
	return false
}

// txRead is one transaction of a call. It reads log parts and resolves
// their events in steps until its budget is spent, taking at least one
// event so that every transaction makes progress.
type txRead struct {
	tx        storage.ReadTx
	c         *watchCall
	head      int64
	compacted int64
	to        int64
	pos       logPos // the next event to take
	partsPos  logPos // where reading log parts goes on
	revs      []RevisionEvents
	pending   []logRef // decoded from parts, not resolved
	partsEnd  bool     // every part up to to has been read
	used      int      // bytes read
	taken     int      // events resolved
}

func (t *txRead) budget() int { return t.c.req.MaxBytes }

func (t *txRead) run() error {
	h, c, err := readState(t.tx)
	if err != nil {
		return err
	}
	t.head, t.compacted = h.Rev, c.Requested
	if t.pos.rev < c.Requested {
		return ErrCompacted
	}
	if t.to < 0 {
		t.to = t.c.lastRev(h.Rev)
	}
	if t.to < t.pos.rev {
		t.partsEnd = true
		return nil
	}
	for t.taken == 0 || t.used < t.budget() {
		if len(t.pending) == 0 {
			if t.partsEnd {
				return nil
			}
			if err := t.readParts(); err != nil {
				return err
			}
			continue
		}
		if err := t.resolveStep(); err != nil {
			return err
		}
	}
	return nil
}

// lastRev is the last revision a call reads, fixed by its first transaction.
func (c *watchCall) lastRev(head int64) int64 {
	to := head
	if c.req.MaxRevs > 0 {
		to = min(to, c.req.From+int64(c.req.MaxRevs)-1)
	}
	if c.req.UpTo > 0 {
		to = min(to, c.req.UpTo)
	}
	return to
}

// exhausted reports whether the transaction read everything up to to.
func (t *txRead) exhausted() bool { return t.partsEnd && len(t.pending) == 0 }

// readParts reads the next log parts, as many as the remaining budget holds
// at the average part size, and decodes their events.
func (t *txRead) readParts() error {
	sizes := &t.c.s.watchSizes
	n := min(max(1, (t.budget()-t.used)/sizes.partBytes()), maxStepParts)
	parts, err := t.tx.GetRange(keyspace.Log(t.partsPos.rev, t.partsPos.part), keyspace.LogFrom(t.to+1), storage.RangeOptions{Limit: n})
	if err != nil {
		return err
	}
	if len(parts) < n {
		t.partsEnd = true
	}
	for _, p := range parts {
		rev, part, err := keyspace.ParseLog(p.Key)
		if err != nil {
			return err
		}
		evs, err := decodeLogPart(p.Value, part == 0)
		if err != nil {
			return err
		}
		skip := 0
		if rev == t.partsPos.rev && part == t.partsPos.part {
			skip = min(t.partsPos.skip, len(evs))
		}
		for i := skip; i < len(evs); i++ {
			t.pending = append(t.pending, logRef{pos: logPos{rev: rev, part: part, skip: i}, ev: evs[i]})
		}
		t.used += len(p.Key) + len(p.Value)
		observe(&sizes.part, defaultPartBytes, len(p.Key)+len(p.Value))
		t.partsPos = logPos{rev: rev, part: part + 1}
	}
	t.syncPos()
	return nil
}

// resolveStep reads the version records of the next pending events, as many
// as the remaining budget holds at the average event size, then the values
// of those that fit the budget (at least one per transaction).
func (t *txRead) resolveStep() error {
	if t.c.req.KeysOnly {
		for _, r := range t.pending {
			t.add(r, nil, nil)
		}
		t.taken += len(t.pending)
		t.pending = nil
		t.syncPos()
		return nil
	}
	sizes := &t.c.s.watchSizes
	k := min(max(1, (t.budget()-t.used)/sizes.eventBytes()), maxStepEvents, len(t.pending))
	step := t.pending[:k]
	cur, prev := make([]*entry, k), make([]*entry, k)
	var es []*entry
	for i, r := range step {
		if r.ev.Type != evDelete {
			cur[i] = &entry{key: r.ev.Key, meta: meta{ModRev: r.pos.rev}}
			es = append(es, cur[i])
		}
		if t.c.req.PrevKV && r.ev.PrevRev != 0 {
			prev[i] = &entry{key: r.ev.Key, meta: meta{ModRev: r.ev.PrevRev}}
			es = append(es, prev[i])
		}
	}
	recBytes, err := readVersions(t.tx, es)
	if err != nil {
		return err
	}
	t.used += recBytes
	n, taking := 0, []*entry(nil)
	for ; n < k; n++ {
		need := chunkBytes(cur[n]) + chunkBytes(prev[n])
		if t.taken+n > 0 && t.used+need > t.budget() {
			break
		}
		t.used += need
		taking = appendFound(taking, cur[n], prev[n])
		observe(&sizes.event, defaultEventBytes, eventOverhead+len(step[n].ev.Key)+versionBytes(cur[n])+versionBytes(prev[n]))
	}
	if err := resolveValues(t.tx, taking); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		t.add(step[i], cur[i], prev[i])
	}
	t.taken += n
	t.pending = t.pending[n:]
	t.syncPos()
	return nil
}

// syncPos moves pos to the next event not taken: the first pending one, or
// where reading parts goes on.
func (t *txRead) syncPos() {
	if len(t.pending) > 0 {
		t.pos = t.pending[0].pos
	} else {
		t.pos = t.partsPos
	}
}

// add appends one resolved event to the transaction's revisions.
func (t *txRead) add(r logRef, cur, prev *entry) {
	ev := &mvccpb.Event{Type: mvccpb.Event_EventType(r.ev.Type)}
	if r.ev.Type == evDelete || t.c.req.KeysOnly {
		ev.Kv = &mvccpb.KeyValue{Key: r.ev.Key, ModRevision: r.pos.rev}
	} else if cur.ver != nil {
		cur.meta = cur.ver.Meta(cur.meta.ModRev)
		ev.Kv = cur.kv(true)
	}
	if prev != nil && prev.ver != nil {
		prev.meta = prev.ver.Meta(prev.meta.ModRev)
		ev.PrevKv = prev.kv(true)
	}
	if n := len(t.revs); n == 0 || t.revs[n-1].Rev != r.pos.rev {
		t.revs = append(t.revs, RevisionEvents{Rev: r.pos.rev})
	}
	re := &t.revs[len(t.revs)-1]
	re.Events = append(re.Events, ev)
}

// readVersions reads the version records of es, leaving ver nil for one that
// compaction already removed (a prev_kv at the compaction boundary), and
// returns the bytes read.
func readVersions(tx storage.ReadTx, es []*entry) (int, error) {
	if len(es) == 0 {
		return 0, nil
	}
	keys := make([][]byte, len(es))
	for i, e := range es {
		keys[i] = keyspace.History(e.key, e.meta.ModRev)
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return 0, err
	}
	n := 0
	for i, e := range es {
		n += len(keys[i]) + len(vals[i])
		if vals[i] == nil {
			continue
		}
		v, err := decodeVersion(vals[i])
		if err != nil {
			return n, err
		}
		e.ver = &v
	}
	return n, nil
}

// chunkBytes is what resolving e's value reads beyond its version record.
func chunkBytes(e *entry) int {
	if e == nil || e.ver == nil {
		return 0
	}
	return int(e.ver.ValueLen) - len(e.ver.First)
}

// versionBytes is e's whole value, as far as its record says.
func versionBytes(e *entry) int {
	if e == nil || e.ver == nil {
		return 0
	}
	return int(e.ver.ValueLen)
}

func appendFound(es []*entry, more ...*entry) []*entry {
	for _, e := range more {
		if e != nil && e.ver != nil {
			es = append(es, e)
		}
	}
	return es
}
