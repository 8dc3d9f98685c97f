package autocompact

import (
	"time"

	"go.uber.org/zap"
)

// periodic's intervals, as etcd's: the compaction interval is the
// retention, at most an hour, and the revision is sampled (and a failed
// compaction retried) ten times per interval.
func (c *Compactor) periodicIntervals() (compactEvery, sampleEvery time.Duration, window int) {
	compactEvery = min(c.cfg.Period, time.Hour)
	sampleEvery = max(compactEvery/10, time.Millisecond) // no busy loop on a nanosecond retention

	return compactEvery, sampleEvery, int(c.cfg.Period/sampleEvery) + 1
}

// runPeriodic is etcd's periodic compactor: revs holds the revisions
// sampled over the last retention period, revs[0] the oldest.
func (c *Compactor) runPeriodic() {
	defer close(c.done)
	compactEvery, sampleEvery, window := c.periodicIntervals()
	revs := make([]int64, 0, window+1)
	var lastRev int64
	lastSuccess := c.cfg.Clock.Now()
	wait := c.cfg.Period // the first compaction waits a whole retention
	for {
		if rev, err := c.store.Rev(c.ctx); err == nil {
			if revs = append(revs, rev); len(revs) > window {
				revs = revs[1:]
			}
		} else {
			c.lg.Debug("auto compaction: reading the revision failed", zap.Error(err))
		}
		if !c.sleep(sampleEvery) {
			return
		}
		if !c.owns() || len(revs) == 0 {
			continue
		}
		rev := revs[0]
		if c.cfg.Clock.Now().Sub(lastSuccess) < wait || rev == lastRev {
			continue
		}
		wait = compactEvery
		c.lg.Info("starting auto periodic compaction", zap.Int64("revision", rev), zap.Duration("compact-period", c.cfg.Period))
		start := c.cfg.Clock.Now()
		if err := c.compact(rev); err != nil {
			c.lg.Warn("failed auto periodic compaction", zap.Int64("revision", rev),
				zap.Duration("compact-period", c.cfg.Period), zap.Duration("retry-interval", sampleEvery), zap.Error(err))
			continue
		}
		c.lg.Info("completed auto periodic compaction", zap.Int64("revision", rev),
			zap.Duration("compact-period", c.cfg.Period), zap.Duration("took", c.cfg.Clock.Now().Sub(start)))
		lastRev, lastSuccess = rev, c.cfg.Clock.Now()
	}
}

// runRevision is etcd's revision compactor: every RevisionInterval, keep
// the last Revisions revisions.
func (c *Compactor) runRevision() {
	defer close(c.done)
	var prev int64
	for c.sleep(RevisionInterval) {
		if !c.owns() {
			continue
		}
		cur, err := c.store.Rev(c.ctx)
		if err != nil {
			c.lg.Debug("auto compaction: reading the revision failed", zap.Error(err))
			continue
		}
		rev := cur - c.cfg.Revisions
		if rev <= 0 || rev == prev {
			continue
		}
		c.lg.Info("starting auto revision compaction", zap.Int64("revision", rev), zap.Int64("revision-compaction-retention", c.cfg.Revisions))
		start := c.cfg.Clock.Now()
		if err := c.compact(rev); err != nil {
			c.lg.Warn("failed auto revision compaction", zap.Int64("revision", rev),
				zap.Int64("revision-compaction-retention", c.cfg.Revisions), zap.Duration("retry-interval", RevisionInterval), zap.Error(err))
			continue
		}
		prev = rev
		c.lg.Info("completed auto revision compaction", zap.Int64("revision", rev),
			zap.Int64("revision-compaction-retention", c.cfg.Revisions), zap.Duration("took", c.cfg.Clock.Now().Sub(start)))
	}
}
