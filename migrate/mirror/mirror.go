// Package mirror copies a running etcd into an empty fdb-etcd store while
// the etcd keeps serving: first a snapshot (Maintenance.Snapshot, loaded as
// `fdb-etcd import` loads one), then a watch from the revision after it,
// each etcd revision written as exactly one revision here, with the same
// number, the same events in the same order (etcd's sub-revisions) and the
// same create and mod revisions and versions, and the leases kept in step.
//
// The snapshot rather than a paged Range starts the copy because a Range
// does not tell a version's sub-revision, which etcd's HashKV hashes, nor
// any history: with the snapshot, Range and Watch at past revisions and
// HashKV answer as the etcd does.
//
// The store must not be served while the mirror runs: the mirror owns it,
// and publishes it (the compaction state, the end of the load) when it
// stops. The cut-over is: stop writes to etcd, wait for zero lag, stop the
// mirror, start fdb-etcd on the store, point clients at it.
package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/migrate/snapimport"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Config tunes a mirror.
type Config struct {
	Source *clientv3.Client
	Target storage.DB
	Logger *zap.Logger
	// Now is the clock of lease deadlines and lag; nil is time.Now.
	Now func() time.Time
	// SnapshotDir holds the snapshot while it is loaded; "" is os.TempDir().
	SnapshotDir string
	// LeaseEvery is how often the leases are brought in step; 0 means 1 s.
	LeaseEvery time.Duration
	// LogEvery is how often the lag is logged; 0 means 5 s.
	LogEvery time.Duration
	// BatchBytes bounds what one storage transaction writes (mvcc's
	// default when 0).
	BatchBytes int
	Metrics    *Metrics // nil: not exported
}

// Mirror is one copy in progress.
type Mirror struct {
	cfg    Config
	lg     *zap.Logger
	loader *mvcc.BulkLoader
	state  mvcc.BulkState // what Publish makes visible once the mirror stops
	leases *leaseSync
	lag    lagStats
}

// Run copies cfg.Source into cfg.Target until ctx ends, then publishes the
// copy at the last revision it wrote. It returns nil when ctx ended and the
// copy was published, and the error that stopped it otherwise (the store
// is then left unpublished: clear it and start over).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LeaseEvery <= 0 {
		cfg.LeaseEvery = time.Second
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = 5 * time.Second
	}
	m := &Mirror{cfg: cfg, lg: cfg.Logger}
	if err := m.loadSnapshot(ctx); err != nil {
		return err
	}
	m.leases = &leaseSync{src: cfg.Source, db: cfg.Target, now: cfg.Now, lg: cfg.Logger}
	err := m.follow(ctx)
	if ctx.Err() == nil {
		return err
	}
	// Finish with a context of its own: ctx ending is how Run is stopped.
	// The leases are brought in step once more, so that a cut-over (writes
	// to the source stopped, zero lag, then the mirror stopped) carries the
	// revocations since the last interval.
	pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.leases.sync(pctx); err != nil {
		return fmt.Errorf("mirror: final lease sync: %w", err)
	}
	if err := m.loader.Publish(pctx, m.state); err != nil {
		return fmt.Errorf("mirror: publish at revision %d: %w", m.state.Head, err)
	}
	n, p50, p99, top := m.lag.quantiles()
	m.lg.Info("mirror stopped and published", zap.Int64("revision", m.state.Head),
		zap.Int64("compact-revision", m.state.Compacted), zap.Int64("revisions-mirrored", n),
		zap.Duration("apply-lag-p50", p50), zap.Duration("apply-lag-p99", p99), zap.Duration("apply-lag-max", top))
	return nil
}

// loadSnapshot copies the source's snapshot to a file and loads it.
func (m *Mirror) loadSnapshot(ctx context.Context) error {
	f, err := os.CreateTemp(m.cfg.SnapshotDir, "fdb-etcd-mirror-*.db")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	rc, err := m.cfg.Source.Snapshot(ctx)
	if err == nil {
		_, err = io.Copy(f, rc)
		rc.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("mirror: snapshot of the source: %w", err)
	}
	loader, res, err := snapimport.Load(ctx, m.cfg.Target, snapimport.Config{
		Path: f.Name(), Logger: m.lg, Now: m.cfg.Now, BatchBytes: m.cfg.BatchBytes,
	})
	if err != nil {
		return err
	}
	m.loader, m.state = loader, res.State()
	m.lg.Info("mirror loaded the source's snapshot; watching from the next revision",
		zap.Int64("revision", res.Head), zap.Int64("compact-revision", res.Compacted), zap.Int("leases", res.Leases))
	return nil
}

// follow watches the source from the revision after the copy and writes
// each revision, while a goroutine it owns keeps the leases in step.
func (m *Mirror) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	leaseErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		leaseErr <- m.leases.run(ctx, m.cfg.LeaseEvery)
		cancel()
	}()
	err := m.watch(ctx)
	cancel()
	wg.Wait()
	// Whichever failed first cancelled the other.
	if lerr := <-leaseErr; lerr != nil && !errors.Is(lerr, context.Canceled) && (err == nil || errors.Is(err, context.Canceled)) {
		return lerr
	}
	return err
}
