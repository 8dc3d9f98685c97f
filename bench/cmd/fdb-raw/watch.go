//go:build fdb

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// watch measures how long a write takes to reach a reader through a
// FoundationDB watch, with the writer of the etcd row (one connection,
// RawSpec.Rate writes/s, open loop).
//
// An etcd watcher watches a prefix; a FoundationDB watch covers one key.
// So, as a layer does (and fdb-etcd's watch hub does with its log), every
// write transaction appends its event to a log under a versionstamped key
// and stamps a tail key, and one watch on the tail wakes one reader, which
// reads the new log entries and would hand them to the watchers in memory.
// One FoundationDB watch per watcher would be N watches on that same tail
// key, which the client merges into one anyway, and then N reads of the same
// entries per wake-up, work no layer does; the fan-out to the watchers is
// not FoundationDB's work. The cell is therefore the same for every watcher
// count: the floor under fdb-etcd's delivery latency at the row's rate.
func (c *client) watch(ctx context.Context) (workload.Result, error) {
	s := c.spec
	d := workload.NewDelivery()
	t := &tail{c: c, deliver: d.Record, ready: make(chan struct{})}
	runErr := make(chan error, 1)
	go func() { runErr <- t.run() }()
	select {
	case <-t.ready:
	case err := <-runErr:
		return workload.Result{}, fmt.Errorf("watch: %w", err)
	case <-ctx.Done():
		t.stop()
		<-runErr
		return workload.Result{}, ctx.Err()
	}
	logKey := append(c.key("log/"), make([]byte, 10)...) // the versionstamp's place
	logKey = binary.LittleEndian.AppendUint32(logKey, uint32(len(logKey)-10))
	tailValue := binary.LittleEndian.AppendUint32(make([]byte, 10), 0)
	wr := workload.OpenLoop{Rate: s.Rate, Duration: s.P.WatchDuration, OpTimeout: s.P.OpTimeout}.Run(ctx, func(context.Context, int64) error {
		stamp := []byte(workload.Stamp(time.Now()))
		_, err := c.db.Transact(func(tr fdb.Transaction) (interface{}, error) {
			tr.SetVersionstampedKey(logKey, stamp)
			tr.SetVersionstampedValue(c.key("tail"), tailValue)
			return nil, nil
		})
		return err
	})
	res, err := d.Result(ctx, wr, s.Rate, 1, s.P.WatchGrace)
	t.stop()
	if terr := <-runErr; terr != nil {
		return workload.Result{}, fmt.Errorf("watch: %w", terr)
	}
	if err != nil {
		return workload.Result{}, err
	}
	res.Note = fmt.Sprintf("one FoundationDB watch on a tail key every write stamps, then a read of the new log entries (%d wake-ups); fan-out to the row's %d watchers is in-memory work, not counted; %s",
		t.wakeups(), s.Watchers, res.Note)
	return res, nil
}

// tail follows the log: read what is new, watch the tail key in the same
// transaction (so nothing committed after that read is missed), wait for
// the watch, repeat.
type tail struct {
	c       *client
	deliver func(now time.Time, stamp []byte)
	ready   chan struct{} // closed once the first watch is set

	mu      sync.Mutex
	watch   fdb.FutureNil // guarded by mu; the watch being waited on
	stopped bool          // guarded by mu
	wakes   int           // guarded by mu
}

func (t *tail) run() error {
	cursor, end := t.c.key("log/"), t.c.key("log0")
	for first := true; ; first = false {
		tr, err := t.c.db.CreateTransaction()
		if err != nil {
			return err
		}
		kvs, err := tr.Snapshot().GetRange(fdb.KeyRange{Begin: cursor, End: end},
			fdb.RangeOptions{Mode: fdb.StreamingModeWantAll}).GetSliceWithError()
		if err != nil {
			return err
		}
		now := time.Now()
		for _, kv := range kvs {
			t.deliver(now, kv.Value)
		}
		if len(kvs) > 0 {
			cursor = append(append(fdb.Key(nil), kvs[len(kvs)-1].Key...), 0)
		}
		w := tr.Watch(t.c.key("tail"))
		// A watch reports other transactions' changes once its own
		// transaction has committed (read-only: no round trip).
		if err := tr.Commit().Get(); err != nil {
			return err
		}
		if first {
			close(t.ready)
		}
		if !t.arm(w) {
			return nil
		}
		if err := w.Get(); err != nil {
			if t.isStopped() {
				return nil
			}
			return err
		}
	}
}

// arm records w as the watch being waited on; false if the tail is stopped.
func (t *tail) arm(w fdb.FutureNil) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		w.Cancel()
		return false
	}
	t.watch = w
	t.wakes++
	return true
}

// stop ends run: it cancels the watch being waited on, or run sees stopped
// before it waits on the next one.
func (t *tail) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.watch != nil {
		t.watch.Cancel()
	}
}

func (t *tail) isStopped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopped
}

// wakeups is how many times the tail read the log after a watch fired.
func (t *tail) wakeups() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.wakes-1, 0)
}
