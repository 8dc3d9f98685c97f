package mvcc

import (
	"context"

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

// ReadEvents returns the events of at most maxRevs revisions starting at from,
// and the current revision. A from below the compacted revision fails with
// ErrCompacted.
func (s *Store) ReadEvents(ctx context.Context, from int64, maxRevs int) ([]RevisionEvents, int64, error) {
	var out []RevisionEvents
	var head int64
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		out = nil
		h, c, err := readState(tx)
		if err != nil {
			return err
		}
		head = h.Rev
		if from < c.Requested {
			return ErrCompacted
		}
		if from > head {
			return nil
		}
		to := min(head, from+int64(maxRevs)-1)
		parts, err := tx.GetRange(keyspace.LogFrom(from), keyspace.LogFrom(to+1), storage.RangeOptions{})
		if err != nil {
			return err
		}
		out, err = s.assembleEvents(tx, parts)
		return err
	})
	if invariants && err == nil {
		checkEventsAtOrBelow(head, out)
	}
	return out, head, err
}

func (s *Store) assembleEvents(tx storage.ReadTx, parts []storage.KeyValue) ([]RevisionEvents, error) {
	var out []RevisionEvents
	var cur, prev []*entry
	for _, p := range parts {
		rev, part, err := keyspace.ParseLog(p.Key)
		if err != nil {
			return nil, err
		}
		evs, err := decodeLogPart(p.Value, part == 0)
		if err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].Rev != rev {
			out = append(out, RevisionEvents{Rev: rev})
		}
		re := &out[len(out)-1]
		for _, le := range evs {
			ev := &mvccpb.Event{Type: mvccpb.Event_EventType(le.Type)}
			re.Events = append(re.Events, ev)
			if le.Type == evDelete {
				ev.Kv = &mvccpb.KeyValue{Key: le.Key, ModRevision: rev}
				cur = append(cur, nil)
			} else {
				cur = append(cur, &entry{key: le.Key, meta: meta{ModRev: rev}})
			}
			if le.PrevRev != 0 {
				prev = append(prev, &entry{key: le.Key, meta: meta{ModRev: le.PrevRev}})
			} else {
				prev = append(prev, nil)
			}
		}
	}
	var need []*entry
	for i := range cur {
		if cur[i] != nil {
			need = append(need, cur[i])
		}
		if prev[i] != nil {
			need = append(need, prev[i])
		}
	}
	if err := resolveTolerant(tx, need); err != nil {
		return nil, err
	}
	i := 0
	for _, re := range out {
		for _, ev := range re.Events {
			if c := cur[i]; c != nil && c.ver != nil {
				c.meta = c.ver.Meta(c.meta.ModRev)
				ev.Kv = c.kv(true)
			}
			if p := prev[i]; p != nil && p.ver != nil {
				p.meta = p.ver.Meta(p.meta.ModRev)
				ev.PrevKv = p.kv(true)
			}
			i++
		}
	}
	return out, nil
}

// resolveTolerant reads versions like resolveValues, but leaves ver nil for a
// version compaction already removed (a prev_kv at the compaction boundary).
func resolveTolerant(tx storage.ReadTx, es []*entry) error {
	keys := make([][]byte, len(es))
	for i, e := range es {
		keys[i] = keyspace.History(e.key, e.meta.ModRev)
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return err
	}
	var found []*entry
	for i, e := range es {
		if vals[i] == nil {
			continue
		}
		v, err := decodeVersion(vals[i])
		if err != nil {
			return err
		}
		e.ver = &v
		found = append(found, e)
	}
	return resolveValues(tx, found)
}

// WaitRev blocks until the current revision exceeds after, and returns it.
// It is woken by the storage's commit notification, never by polling.
func (s *Store) WaitRev(ctx context.Context, after int64) (int64, error) {
	for {
		var raw []byte
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			raw, err = tx.Get(keyspace.Head)
			return err
		})
		if err != nil {
			return 0, err
		}
		h, err := revision.DecodeHead(raw)
		if err != nil {
			return 0, err
		}
		if h.Rev > after {
			return h.Rev, nil
		}
		if err := s.db.WaitChange(ctx, keyspace.Head, raw); err != nil {
			return 0, err
		}
	}
}
