package mvcc

import (
	"context"
	"sort"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

type compactRequest struct{ rev int64 }

type compactWaiter struct {
	rev  int64
	done chan struct{}
}

// Compact marks every revision below rev unreadable, with etcd's errors, and
// schedules the physical removal of the history it frees. With physical set
// it returns only once that removal is done, as etcd does.
func (s *Store) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	resp, err := s.write(ctx, &compactRequest{rev: r.Revision}, 16)
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

func (s *Store) checkCompact(tx storage.ReadTx, rev int64, r *compactRequest) (compaction, error) {
	_, c, err := readState(tx)
	if err != nil {
		return c, err
	}
	switch {
	case r.rev <= c.Requested:
		return c, ErrCompacted
	case r.rev > rev:
		return c, ErrFutureRev
	}
	return c, nil
}

func (s *Store) applyCompact(tx storage.Tx, rev int64, id revision.RequestID, r *compactRequest) (any, bool, error, error) {
	c, err := s.checkCompact(tx, rev, r)
	if err != nil {
		if domainError(err) {
			return nil, false, err, nil
		}
		return nil, false, nil, err
	}
	c.Requested, c.By = r.rev, id
	tx.Set(keyspace.Compaction, encodeCompaction(c))
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
}

func (s *Store) replayCompact(tx storage.ReadTx, rev int64, id revision.RequestID, r *compactRequest) (any, bool, error, error) {
	_, c, err := readState(tx)
	if err != nil {
		return nil, false, nil, err
	}
	if c.By == id {
		return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
	}
	// It did not set the compaction, so it failed its checks.
	if r.rev > rev {
		return nil, false, ErrFutureRev, nil
	}
	return nil, false, ErrCompacted, nil
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
// physical compaction catches up with the requested one.
func (s *Store) compactor() {
	defer s.wg.Done()
	ctx := s.ctx
	for {
		select {
		case <-s.compactWake:
		case <-s.stop:
			return
		}
		start, keys := time.Now(), 0
		for {
			finished, more, n, err := s.compactStep(ctx)
			keys += n
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.lg.Warn("physical compaction step failed; will retry")
				time.Sleep(100 * time.Millisecond)
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
	}
}

// compactStep cleans up the keys changed by the next run of compacted
// revisions. For each such key, every version older than its newest version
// at or below the compaction revision goes; that newest version goes too if
// it is a tombstone strictly below it, along with the key's index entry, so a
// deleted key can never reappear.
func (s *Store) compactStep(ctx context.Context) (finished int64, more bool, cleaned int, err error) {
	err = s.db.Update(ctx, func(tx storage.Tx) error {
		finished, more, cleaned = 0, false, 0
		_, c, err := readState(tx)
		if err != nil {
			return err
		}
		from := max(c.Finished, 1)
		if from >= c.Requested {
			// Nothing below the requested revision is left to remove.
			finished = max(c.Finished, c.Requested)
			return nil
		}
		// The revision at the compaction point itself is read too: a key
		// changed exactly there still has older versions to remove. Its log
		// entry stays, since a watch may start at the compaction revision.
		parts, err := tx.GetRange(keyspace.LogFrom(from), keyspace.LogFrom(c.Requested+1),
			storage.RangeOptions{Limit: s.cfg.CompactionBatch})
		if err != nil {
			return err
		}
		keys := map[string]struct{}{}
		upTo := c.Requested // exclusive: revisions below it are covered
		for i, p := range parts {
			rev, _, err := keyspace.ParseLog(p.Key)
			if err != nil {
				return err
			}
			if len(keys) >= s.cfg.CompactionBatch && i > 0 {
				// Stop at a revision boundary.
				prev, _, _ := keyspace.ParseLog(parts[i-1].Key)
				if prev != rev {
					upTo = rev
					break
				}
			}
			e, err := decodeLogPart(p.Value, isFirstPart(p.Key))
			if err != nil {
				return err
			}
			for _, ev := range e {
				keys[string(ev.Key)] = struct{}{}
			}
		}
		if len(parts) == s.cfg.CompactionBatch && upTo == c.Requested {
			last, _, _ := keyspace.ParseLog(parts[len(parts)-1].Key)
			upTo = last // the last revision may have more parts; redo it next time
			if upTo <= from {
				upTo = from + 1
			}
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			if err := compactKey(tx, []byte(k), c.Requested); err != nil {
				return err
			}
		}
		cleaned = len(sorted)
		tx.ClearRange(keyspace.LogFrom(from), keyspace.LogFrom(upTo))
		c.Finished = upTo
		tx.Set(keyspace.Compaction, encodeCompaction(c))
		finished, more = upTo, upTo < c.Requested
		return nil
	})
	return finished, more, cleaned, err
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
