package mirror

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// leaseBatch bounds the lease records one transaction writes.
const leaseBatch = 500

// leaseSync keeps the target's leases in step with the source's: grants
// (with their remaining TTL, renewed by the source's keep-alives) and
// revocations. Leases are not in the watch stream, so it asks the source
// for them every interval, and before a revision attaches a key to a lease
// it has not seen yet.
type leaseSync struct {
	src *clientv3.Client
	db  storage.DB
	now func() time.Time
	lg  *zap.Logger

	mu sync.Mutex
	// known holds the leases the target has a record of, with the deadline
	// last written (zero: not written by this mirror); nil until read.
	known map[int64]time.Time // guarded by mu
}

type leaseTTL struct{ id, granted, ttl int64 }

func (t leaseTTL) deadline(now time.Time) time.Time {
	return now.Add(time.Duration(t.ttl) * time.Second)
}

// ensure writes the records of the leases in ids that the target lacks.
// A lease the source no longer has gets none: etcd's restore does not
// attach keys to a lease it lacks either, and the key's deletion follows.
func (l *leaseSync) ensure(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := l.knownSet(ctx, false); err != nil {
		return err
	}
	var add []leaseTTL
	for _, id := range ids {
		if l.has(id) {
			continue
		}
		t, ok, err := l.ttl(ctx, id)
		if err != nil {
			return err
		}
		if ok {
			add = append(add, t)
		}
	}
	return l.write(ctx, add, nil)
}

// run brings every lease in step each interval until ctx ends.
func (l *leaseSync) run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := l.sync(ctx); err != nil {
			return err
		}
	}
}

func (l *leaseSync) sync(ctx context.Context) error {
	resp, err := l.src.Lease.Leases(ctx)
	if err != nil {
		return err
	}
	known, err := l.knownSet(ctx, true)
	if err != nil {
		return err
	}
	live := map[int64]bool{}
	var set []leaseTTL
	now := l.now()
	for _, s := range resp.Leases {
		t, ok, err := l.ttl(ctx, int64(s.ID))
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		live[t.id] = true
		// A deadline that moved by less than TimeToLive's one-second
		// resolution was not renewed: leave it, and the revisions' reads of
		// the record, alone.
		if d, ok := known[t.id]; !ok || d.IsZero() || t.deadline(now).Sub(d).Abs() > time.Second {
			set = append(set, t)
		}
	}
	var gone []int64
	for id := range known {
		if !live[id] {
			gone = append(gone, id)
		}
	}
	return l.write(ctx, set, gone)
}

// ttl asks the source for a lease's granted and remaining TTL; ok is false
// when the source does not have it.
func (l *leaseSync) ttl(ctx context.Context, id int64) (leaseTTL, bool, error) {
	r, err := l.src.Lease.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return leaseTTL{}, false, err
	}
	if r.TTL < 0 {
		return leaseTTL{}, false, nil
	}
	return leaseTTL{id: id, granted: r.GrantedTTL, ttl: r.TTL}, true, nil
}

// write sets the records in set and removes those in gone, leaseBatch per
// transaction.
func (l *leaseSync) write(ctx context.Context, set []leaseTTL, gone []int64) error {
	for len(set) > 0 || len(gone) > 0 {
		ns, ng := min(len(set), leaseBatch), min(len(gone), leaseBatch-min(len(set), leaseBatch))
		s, g := set[:ns], gone[:ng]
		now := l.now()
		err := l.db.Update(ctx, func(tx storage.Tx) error {
			for _, t := range s {
				if err := lease.WriteImported(tx, t.id, max(t.granted, 1), t.deadline(now)); err != nil {
					return err
				}
			}
			for _, id := range g {
				lease.RemoveImported(tx, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
		l.mu.Lock()
		for _, t := range s {
			l.known[t.id] = t.deadline(now)
		}
		for _, id := range g {
			delete(l.known, id)
		}
		l.mu.Unlock()
		if len(g) > 0 {
			l.lg.Debug("mirror removed leases the source no longer has", zap.Int("leases", len(g)))
		}
		set, gone = set[ns:], gone[ng:]
	}
	return nil
}

func (l *leaseSync) has(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.known[id]
	return ok
}

// knownSet reads the leases the target has, once, and returns a copy of
// them when asked to.
func (l *leaseSync) knownSet(ctx context.Context, copied bool) (map[int64]time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.known == nil {
		known := map[int64]time.Time{}
		begin, end := keyspace.LeaseAll()
		for begin != nil {
			var kvs []storage.KeyValue
			if err := l.db.View(ctx, func(tx storage.ReadTx) error {
				var err error
				kvs, err = tx.GetRange(begin, end, storage.RangeOptions{Limit: 10_000})
				return err
			}); err != nil {
				return nil, err
			}
			for _, kv := range kvs {
				id, err := keyspace.ParseLease(kv.Key)
				if err != nil {
					return nil, err
				}
				known[id] = time.Time{}
			}
			begin = nil
			if len(kvs) == 10_000 {
				begin = append(kvs[len(kvs)-1].Key, 0)
			}
		}
		l.known = known
	}
	if !copied {
		return nil, nil
	}
	out := make(map[int64]time.Time, len(l.known))
	for id, d := range l.known {
		out[id] = d
	}
	return out, nil
}
