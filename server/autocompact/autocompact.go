// Package autocompact is etcd's automatic compaction (--auto-compaction-mode
// and --auto-compaction-retention, etcd's v3compactor), for a store that
// several replicas share: every replica runs the loop and keeps its window
// of revisions, but only the replica that owns writes compacts, as only
// etcd's leader does; the others are paused. A compaction goes through the
// write path, so a replica that has just lost ownership forwards it to the
// new owner like any other write.
//
// Periodic retention R keeps about R of history: the loop samples the
// current revision every R/10 (at most every 6 minutes) and, once R has
// passed since the last compaction (after the first, every min(R, 1h)),
// compacts to the revision sampled R ago. Revision retention N compacts to
// current-N every 5 minutes when that has moved.
package autocompact

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/server/errmap"
)

// Mode is how the retention is read.
type Mode int

const (
	// Periodic retains Config.Period of history.
	Periodic Mode = iota
	// Revision retains Config.Revisions revisions.
	Revision
)

// RevisionInterval is how often revision mode checks, as in etcd.
const RevisionInterval = 5 * time.Minute

// Config is the compaction policy; a zero retention disables it.
type Config struct {
	Mode      Mode
	Period    time.Duration
	Revisions int64
	Clock     clock.Clock
	Logger    *zap.Logger
}

// Enabled reports whether the policy compacts at all.
func (c Config) Enabled() bool {
	if c.Mode == Revision {
		return c.Revisions > 0
	}
	return c.Period > 0
}

// Target is the key space the loop compacts: its revision, read, and its
// compaction, through the write path.
type Target interface {
	// Rev is the current revision.
	Rev(ctx context.Context) (int64, error)
	// Compact is the write path's compaction (forwarded to the owner).
	Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error)
}

// Compactor runs the loop of one replica.
type Compactor struct {
	cfg   Config
	store Target
	owns  func() bool
	lg    *zap.Logger

	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
}

// Start runs the loop until Stop; owns reports whether this replica owns
// writes now (the loop is paused while it does not). A disabled policy
// starts nothing.
func Start(cfg Config, store Target, owns func() bool) *Compactor {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Compactor{cfg: cfg, store: store, owns: owns, lg: cfg.Logger, ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{})}
	if !cfg.Enabled() {
		close(c.done)
		return c
	}
	if cfg.Mode == Revision {
		go c.runRevision()
	} else {
		go c.runPeriodic()
	}
	return c
}

// Stop ends the loop, cancelling a compaction in flight, and waits for it.
func (c *Compactor) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.cancel()
	<-c.done
}

// sleep waits d; false once stopped.
func (c *Compactor) sleep(d time.Duration) bool {
	c.cfg.Clock.Sleep(d, c.stop, nil)
	select {
	case <-c.stop:
		return false
	default:
		return true
	}
}

// compact compacts to rev; nil means the store is now compacted there:
// etcd counts "already compacted" as success.
func (c *Compactor) compact(rev int64) error {
	_, err := c.store.Compact(c.ctx, &pb.CompactionRequest{Revision: rev})
	if err != nil && errors.Is(errmap.ToGRPC(err), rpctypes.ErrGRPCCompacted) {
		return nil
	}
	return err
}
