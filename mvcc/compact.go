package mvcc

import (
	"bytes"
	"context"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

type compactWaiter struct {
	rev  int64
	done chan struct{}
}

// Compact marks every revision below rev unreadable, with etcd's errors, and
// schedules the physical removal of the history it frees. With physical set
// it returns only once that removal is done, as etcd does.
func (s *Store) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	resp, err := s.write(ctx, &compactRequest{s: s, rev: r.Revision}, 16)
	if err != nil {
		return nil, err
	}
	s.wakeCompactor()
	if r.Physical {
		if err := s.waitCompacted(ctx, r.Revision); err != nil {
			return nil, err
		}
	}
	return resp.(*pb.CompactionResponse), nil
}

// checkCompact is etcd's check of a compaction request against the
// compaction revision before it and the current revision.
func checkCompact(compacted, rev int64, r *compactRequest) error {
	switch {
	case r.rev <= compacted:
		return ErrCompacted
	case r.rev > rev:
		return ErrFutureRev
	}
	return nil
}

func (s *Store) applyCompact(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID, r *compactRequest) (writeResponse, bool, error, error) {
	if err := checkCompact(env.Compacted, rev, r); err != nil {
		return nil, false, err, nil
	}
	v, err := tx.Get(keyspace.Compaction)
	if err != nil {
		return nil, false, nil, err
	}
	c, err := decodeCompaction(v)
	if err != nil {
		return nil, false, nil, err
	}
	c.Requested, c.By = r.rev, id
	tx.Set(keyspace.Compaction, encodeCompaction(c))
	env.Compacted = r.rev
	s.tail.compactedTo(r.rev)
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
}

// replayCompact repeats the checks under the compaction revision the commit
// saw: a later compaction must not turn a committed one into a failure.
func (s *Store) replayCompact(env *revision.Env, rev int64, r *compactRequest) (writeResponse, bool, error, error) {
	if err := checkCompact(env.Compacted, rev, r); err != nil {
		return nil, false, err, nil
	}
	env.Compacted = r.rev
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
}

func (s *Store) wakeCompactor() {
	select {
	case s.compactWake <- struct{}{}:
	default:
	}
}

func (s *Store) waitCompacted(ctx context.Context, rev int64) error {
	w := compactWaiter{rev: rev, done: make(chan struct{})}
	s.compactMu.Lock()
	s.compactWaiters = append(s.compactWaiters, w)
	s.compactMu.Unlock()
	s.wakeCompactor()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return ErrStopped
	}
}

func (s *Store) notifyCompacted(finished int64) {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	j := 0
	for _, w := range s.compactWaiters {
		if w.rev <= finished {
			close(w.done)
			continue
		}
		s.compactWaiters[j] = w
		j++
	}
	s.compactWaiters = s.compactWaiters[:j]
}

// compactor removes compacted history in bounded transactions until the
// physical compaction catches up with the revision compactTarget allows.
func (s *Store) compactor() {
	defer s.wg.Done()
	ctx := s.ctx
	seen := newHoldersSeen()
	wake := time.NewTimer(time.Hour)
	wake.Stop()
	defer wake.Stop()
	for {
		select {
		case <-s.compactWake:
		case <-wake.C:
		case <-s.stop:
			return
		}
		target, later, err := s.compactTarget(ctx, seen)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.lg.Warn("reading the compaction state failed; will retry", zap.Error(err))
			later = 100 * time.Millisecond
		}
		if err == nil && !s.compactTo(ctx, target) {
			return
		}
		if later > 0 {
			wake.Reset(later)
		}
	}
}

// compactTo runs physical compaction steps up to target; false means the
// store is closing.
func (s *Store) compactTo(ctx context.Context, target int64) bool {
	start, keys := time.Now(), 0
	for {
		finished, more, n, err := s.compactStep(ctx, target)
		keys += n
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			s.lg.Warn("physical compaction step failed; will retry", zap.Error(err))
			select {
			case <-time.After(100 * time.Millisecond):
			case <-s.stop:
				return false
			}
			continue
		}
		s.notifyCompacted(finished)
		if !more {
			break
		}
	}
	if keys > 0 && s.cfg.ObserveCompaction != nil {
		s.cfg.ObserveCompaction(time.Since(start), keys)
	}
	return true
}

// markerSeen is when the compactor first saw each holder of a kind it still
// finds, by key.
type markerSeen map[string]time.Time

// maxMarkers bounds the markers one look reads; the expired ones among them
// are cleared, so a later look sees the rest.
const maxMarkers = 4096

// compactTarget returns the revision physical compaction may reach now, and
// how long until it may reach a newer one (0: nothing is waiting).
//
// Physical compaction must never remove history that a replay could read:
// after commit_unknown_result, a batch is replayed reading the store as of
// the head it applied on, or an older revision a Txn's Range asked for
// (Request.Replay), and a compaction to C above that removes versions the
// replay needs. Such a batch has a batch marker recording the oldest
// revision it read (its floor), stored when it committed, which its writer
// clears in its next batch, once nothing can replay it:
//   - a batch that commits after the compaction to C was requested reads
//     nothing below C, so when the compactor reads the markers after that
//     request, every marker that matters is there
//     (revision.ReplayableMarkers);
//   - every attempt of a batch happens within its writer's CommitTimeout,
//     so a marker first seen ReplayWindow ago is of a decided batch whatever
//     process wrote it (a writer that stopped leaves its last marker); the
//     compactor clears those;
//   - so physical compaction goes as far as the requested revision, or the
//     lowest floor of a marker seen for less than ReplayWindow, and waits
//     only while a batch reading below the requested revision may still
//     replay. Usually none does: a writer's newest batch is the compaction
//     request's own or newer, and reads nothing older than its head.
//   - with SoleWriter, no other process writes the storage, and this
//     store's own sequencer says when its batches running at that moment
//     are decided (Sequencer.Settle), usually at once.
func (s *Store) compactTarget(ctx context.Context, seen holdersSeen) (int64, time.Duration, error) {
	var c compaction
	var markers, pins []holder
	var more bool
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		v, err := tx.Get(keyspace.Compaction)
		if err != nil {
			return err
		}
		if c, err = decodeCompaction(v); err != nil || c.Requested <= c.Finished {
			return err // nothing to wait for: nothing to read
		}
		if pins, err = readPins(tx); err != nil || s.cfg.SoleWriter {
			return err // no marker to read
		}
		markers, more, err = replayableMarkers(tx)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	target, wait := c.Requested, time.Duration(0)
	var expired [][]byte
	if s.cfg.SoleWriter {
		err = s.seq.Settle(ctx)
	} else {
		target, wait, expired = heldTarget(target, markers, seen.markers, s.cfg.Now(), s.cfg.Sequencer.ReplayWindow())
	}
	pinned, pinWait, pinsExpired := heldTarget(target, pins, seen.pins, s.cfg.Now(), s.cfg.ReadPinWindow)
	if len(pins) == maxPins {
		// Pins not looked at are no lower than the last one read.
		pinned, pinWait = min(pinned, pins[maxPins-1].floor), max(pinWait, pinPoll)
	}
	if pinned < target {
		// A Range usually drops its pin within moments; look again soon
		// rather than when the pin would expire.
		target, wait = pinned, min(pinWait, pinPoll)
	}
	expired = append(expired, pinsExpired...)
	if err == nil && len(expired) > 0 {
		err = s.db.Update(ctx, func(tx storage.Tx) error {
			for _, k := range expired {
				tx.Clear(k)
			}
			return nil
		})
	}
	if more {
		// Markers not looked at may hold the target back; the expired
		// ones cleared, the next look sees them.
		target, wait = c.Finished, 100*time.Millisecond
	}
	return max(target, c.Finished), wait, err
}

// pinPoll is how often the compactor looks again while a read pin holds it
// back; a pin of this process wakes it when it goes.
const pinPoll = 100 * time.Millisecond

// holder is a record that holds physical compaction at floor: a batch
// marker (a batch that may replay reading floor) or a read pin.
type holder struct {
	key   []byte
	floor int64
}

func replayableMarkers(tx storage.ReadTx) ([]holder, bool, error) {
	ms, more, err := revision.ReplayableMarkers(tx, maxMarkers)
	hs := make([]holder, len(ms))
	for i, m := range ms {
		hs[i] = holder{key: m.Key, floor: m.Floor}
	}
	return hs, more, err
}

// holdersSeen is when the compactor first saw each batch marker and each
// read pin it still finds.
type holdersSeen struct{ markers, pins markerSeen }

func newHoldersSeen() holdersSeen { return holdersSeen{markers: markerSeen{}, pins: markerSeen{}} }

// heldTarget lowers target to the floor of every holder seen for less than
// window, and returns how long until the first of those expires and the
// holders that have. seen is updated to the holders found.
func heldTarget(target int64, holders []holder, seen markerSeen, now time.Time, window time.Duration) (int64, time.Duration, [][]byte) {
	var wait time.Duration
	var expired [][]byte
	found := make(map[string]bool, len(holders))
	for _, h := range holders {
		k := string(h.key)
		found[k] = true
		first, ok := seen[k]
		if !ok {
			first, seen[k] = now, now
		}
		age := now.Sub(first)
		switch {
		case age >= window:
			expired = append(expired, h.key)
		case h.floor < target:
			target = h.floor
			if left := window - age; wait == 0 || left < wait {
				wait = left
			}
		}
	}
	for k := range seen {
		if !found[k] {
			delete(seen, k)
		}
	}
	return target, wait, expired
}

// compactStep cleans up the keys changed by the next run of revisions up to
// target (at most the requested compaction revision), reading their log
// parts from where the last step stopped, and stopping at a part boundary
// once it has CompactionBatch keys, so that a revision of any size (a
// staged delete of 200,000 keys) is cleaned up across several steps. For
// each key, every version older than its newest version at or below target
// goes; that newest version goes too if it is a tombstone strictly below
// target, along with the key's index entry, so a deleted key can never
// reappear. The log of the target revision itself stays, since a watch may
// start there; its keys are cleaned up again for the next target.
func (s *Store) compactStep(ctx context.Context, target int64) (finished int64, more bool, cleaned int, err error) {
	err = s.db.Update(ctx, func(tx storage.Tx) error {
		finished, more, cleaned = 0, false, 0
		_, c, err := readState(tx)
		if err != nil {
			return err
		}
		to := min(target, c.Requested)
		from, part := max(c.Finished, 1), c.Part
		if part == partDone {
			if from >= to {
				finished = max(c.Finished, to)
				return nil // nothing up to the target is left to clean
			}
			part = 0 // clean revision Finished again, for the new target
		}
		parts, cut, err := stepParts(tx, keyspace.Log(from, int(part)), keyspace.LogFrom(to+1), s.cfg.CompactionBatch)
		if err != nil {
			return err
		}
		keys, nextRev, nextPart, err := stepKeys(parts, s.cfg.CompactionBatch, cut)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := compactKey(tx, []byte(k), to); err != nil {
				return err
			}
		}
		cleaned = len(keys)
		if nextRev == 0 { // every part up to the target is done
			nextRev, nextPart = to, partDone
		}
		tx.ClearRange(keyspace.LogFrom(from), keyspace.LogFrom(min(nextRev, to)))
		c.Finished, c.Part = nextRev, nextPart
		tx.Set(keyspace.Compaction, encodeCompaction(c))
		// Every revision below the cursor's is clean; the target's is
		// clean once the cursor says done.
		finished, more = nextRev-1, nextPart != partDone
		if !more {
			finished = to
		}
		return nil
	})
	return finished, more, cleaned, err
}

// stepParts reads log parts from begin, in reads of growing size (a part
// holds one small revision's events or up to 90 kB of a large one's), until
// they name at least batch events or the range [begin, end) is exhausted;
// cut says that more parts may follow.
func stepParts(tx storage.ReadTx, begin, end []byte, batch int) (parts []storage.KeyValue, cut bool, err error) {
	events := 0
	for limit := 8; ; limit = min(2*limit, 1024) {
		kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: limit})
		if err != nil {
			return nil, false, err
		}
		parts = append(parts, kvs...)
		for _, kv := range kvs {
			_, part, err := keyspace.ParseLog(kv.Key)
			if err != nil {
				return nil, false, err
			}
			evs, err := decodeLogPart(kv.Value, part == 0)
			if err != nil {
				return nil, false, err
			}
			events += len(evs)
		}
		if len(kvs) < limit {
			return parts, false, nil
		}
		if events >= batch {
			return parts, true, nil
		}
		begin = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
	}
}

// stepKeys returns, sorted, the keys named by the leading log parts that
// hold at least batch keys (at least one part), and the revision and part
// of the first part left for the next step; 0 when none is left, that is
// when the parts were not cut (by stepParts) and all were taken.
func stepKeys(parts []storage.KeyValue, batch int, cut bool) (keys []string, nextRev int64, nextPart uint32, err error) {
	set := map[string]struct{}{}
	for i, p := range parts {
		rev, part, err := keyspace.ParseLog(p.Key)
		if err != nil {
			return nil, 0, 0, err
		}
		if len(set) >= batch && i > 0 {
			nextRev, nextPart = rev, uint32(part)
			break
		}
		evs, err := decodeLogPart(p.Value, part == 0)
		if err != nil {
			return nil, 0, 0, err
		}
		for _, ev := range evs {
			set[string(ev.Key)] = struct{}{}
		}
		if i == len(parts)-1 && cut {
			nextRev, nextPart = rev, uint32(part+1) // more may follow
		}
	}
	keys = make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nextRev, nextPart, nil
}

func isFirstPart(k []byte) bool {
	_, part, err := keyspace.ParseLog(k)
	return err == nil && part == 0
}

func decodeLogPart(v []byte, first bool) ([]logEvent, error) {
	if first {
		e, err := decodeLog([][]byte{v})
		return e.Events, err
	}
	// Later parts carry no request id; decode them behind a dummy one.
	dummy := make([]byte, 17, 17+len(v))
	dummy = append(dummy, v...)
	e, err := decodeLog([][]byte{dummy})
	return e.Events, err
}

func compactKey(tx storage.Tx, key []byte, at int64) error {
	vers, err := tx.GetRange(keyspace.HistoryPrefix(key), keyspace.History(key, at+1), storage.RangeOptions{})
	if err != nil || len(vers) == 0 {
		return err
	}
	newest := vers[len(vers)-1]
	_, newestRev, err := keyspace.ParseHistory(newest.Key)
	if err != nil {
		return err
	}
	nv, err := decodeVersion(newest.Value)
	if err != nil {
		return err
	}
	drop := vers[:len(vers)-1]
	if nv.Tombstone && newestRev < at {
		drop = vers
		latest, err := tx.Get(keyspace.Latest(key))
		if err != nil {
			return err
		}
		if latest != nil {
			m, err := decodeMeta(latest)
			if err != nil {
				return err
			}
			if m.Tombstone && m.ModRev == newestRev {
				tx.Clear(keyspace.Latest(key))
			}
		}
	}
	for _, v := range drop {
		tx.Clear(v.Key)
		dv, err := decodeVersion(v.Value)
		if err != nil {
			return err
		}
		if dv.Chunks > 1 {
			_, rev, err := keyspace.ParseHistory(v.Key)
			if err != nil {
				return err
			}
			b, e := keyspace.ChunkVersion(key, rev)
			tx.ClearRange(b, e)
		}
	}
	return nil
}
