package mirror

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// watch follows the source from the revision after the copy. Each watch
// response carries whole revisions (etcd never splits one across
// responses unless it is fragmented, which this watch does not ask for);
// their events, in order, are the revision's changes by sub-revision.
func (m *Mirror) watch(ctx context.Context) error {
	wch := m.cfg.Source.Watch(clientv3.WithRequireLeader(ctx), "\x00", clientv3.WithFromKey(),
		clientv3.WithRev(m.state.Head+1), clientv3.WithProgressNotify())
	tick := time.NewTicker(m.cfg.LogEvery)
	defer tick.Stop()
	// The source was at the snapshot's revision when it took it. A source
	// that takes no write after it sends no event, so the mirror must say
	// now that it is caught up, or a cut-over waiting for zero lag waits
	// for ever.
	source := m.state.Head
	m.cfg.Metrics.applied(m.state.Head, source, -1)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			m.lg.Info("mirror lag", zap.Int64("source-revision", source), zap.Int64("revision", m.state.Head),
				zap.Int64("lag-revisions", max(source-m.state.Head, 0)))
		case resp, ok := <-wch:
			if !ok {
				return ctx.Err()
			}
			if err := resp.Err(); err != nil {
				if resp.CompactRevision != 0 {
					return fmt.Errorf("mirror: the source compacted revision %d before the mirror read it: %w", m.state.Head+1, err)
				}
				return fmt.Errorf("mirror: watch: %w", err)
			}
			source = max(source, resp.Header.Revision)
			if err := m.apply(ctx, resp.Events, source, m.cfg.Now()); err != nil {
				return err
			}
		}
	}
}

// apply writes the events of one watch response, one revision at a time.
func (m *Mirror) apply(ctx context.Context, events []*clientv3.Event, source int64, received time.Time) error {
	for len(events) > 0 {
		rev := events[0].Kv.ModRevision
		n := 1
		for n < len(events) && events[n].Kv.ModRevision == rev {
			n++
		}
		if err := m.applyRevision(ctx, rev, events[:n]); err != nil {
			return err
		}
		events = events[n:]
		m.lag.observe(m.cfg.Now().Sub(received))
		m.cfg.Metrics.applied(rev, source, m.cfg.Now().Sub(received))
	}
	m.cfg.Metrics.applied(m.state.Head, source, -1)
	return nil
}

// applyRevision writes revision rev (whose events are evs) as one
// revision of the store, after the revision before it.
func (m *Mirror) applyRevision(ctx context.Context, rev int64, evs []*clientv3.Event) error {
	if rev != m.state.Head+1 {
		return fmt.Errorf("mirror: revision %d after %d: the source's revisions must be dense", rev, m.state.Head)
	}
	var (
		ids  []int64
		vers = make([]mvcc.LoadedVersion, len(evs))
	)
	for sub, ev := range evs {
		v := mvcc.LoadedVersion{Key: ev.Kv.Key, Rev: rev, Sub: int64(sub), Tombstone: ev.Type == mvccpb.DELETE}
		if !v.Tombstone {
			v.CreateRev, v.Version, v.Lease, v.Value = ev.Kv.CreateRevision, ev.Kv.Version, ev.Kv.Lease, ev.Kv.Value
			if v.Lease != 0 {
				ids = append(ids, v.Lease)
			}
		}
		vers[sub] = v
	}
	// A key's lease must exist before the key attaches to it.
	if err := m.leases.ensure(ctx, ids); err != nil {
		return err
	}
	for _, v := range vers {
		if err := m.loader.Add(ctx, v); err != nil {
			return err
		}
	}
	if err := m.loader.FlushHead(ctx, rev); err != nil {
		return err
	}
	m.state.Head = rev
	return nil
}
