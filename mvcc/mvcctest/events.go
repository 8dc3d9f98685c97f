// Package mvcctest helps tests read what an mvcc.Store committed. No
// product code imports it, so it stays out of the binaries.
package mvcctest

import (
	"context"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// EventSource is what ReadEvents reads: *mvcc.Store.
type EventSource interface {
	ReadWatchEvents(ctx context.Context, r mvcc.WatchRead) (mvcc.EventBatch, error)
}

// ReadEvents returns the events, with PrevKv, of the revisions
// from..from+maxRevs-1 up to the head, and the head revision:
// ReadWatchEvents read to the end of that range. A from below the compacted
// revision fails with mvcc.ErrCompacted.
func ReadEvents(ctx context.Context, s EventSource, from int64, maxRevs int) ([]mvcc.RevisionEvents, int64, error) {
	var out []mvcc.RevisionEvents
	upTo := from + int64(maxRevs) - 1
	for {
		b, err := s.ReadWatchEvents(ctx, mvcc.WatchRead{From: from, UpTo: upTo, PrevKV: true})
		if err != nil {
			return nil, b.Head, err
		}
		out = append(out, b.Revs...)
		if b.To >= min(upTo, b.Head) {
			return out, b.Head, nil
		}
		from = b.To + 1
	}
}
