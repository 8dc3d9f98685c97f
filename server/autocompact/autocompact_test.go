package autocompact_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/server/autocompact"
)

// TestMain lets `make test-fdb` run these tests on FoundationDB.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// store is a real mvcc store, read and compacted as the server does.
type store struct{ *mvcc.Store }

func (s store) Rev(ctx context.Context) (int64, error) {
	rev, _, err := s.Store.Rev(ctx)
	return rev, err
}

func open(t *testing.T) store {
	t.Helper()
	s, err := mvcc.Open(testdb.Open(t), mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return store{s}
}

func put(t *testing.T, s store, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := s.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
}

func compacted(t *testing.T, s store) int64 {
	t.Helper()
	_, c, err := s.Store.Rev(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPeriodic follows etcd's periodic compactor with a 10 minute
// retention: a sample every minute, the first compaction after 10 minutes
// to the first sample, the next 10 minutes later to the sample 11 minutes
// old; nothing while this replica does not own writes.
func TestPeriodic(t *testing.T) {
	s := open(t)
	put(t, s, 5) // revision 6
	fc := fakeclock.New(time.Unix(1_700_000_000, 0))
	var owns atomic.Bool
	owns.Store(true)
	c := autocompact.Start(autocompact.Config{Mode: autocompact.Periodic, Period: 10 * time.Minute, Clock: fc}, s, owns.Load)
	defer c.Stop()
	minute := func() { // one write, then the next sample
		fc.BlockUntil(t, 1)
		put(t, s, 1)
		fc.Advance(time.Minute)
		fc.BlockUntil(t, 1)
	}
	for i := 1; i < 10; i++ {
		minute()
		if got := compacted(t, s); got > 0 {
			t.Fatalf("compacted to %d after %d minutes", got, i)
		}
	}
	minute() // 10 minutes: compact to the sample taken at 0 (revision 6)
	if got := compacted(t, s); got != 6 {
		t.Fatalf("after 10 minutes compacted to %d, want 6", got)
	}
	owns.Store(false)
	for i := 11; i <= 20; i++ {
		minute()
	}
	if got := compacted(t, s); got != 6 {
		t.Fatalf("a replica that does not own writes compacted to %d", got)
	}
	owns.Store(true)
	minute() // 21 minutes: the oldest of the 11 samples is from minute 10 (revision 16)
	if got := compacted(t, s); got != 16 {
		t.Fatalf("after 21 minutes compacted to %d, want 16", got)
	}
}

// TestRevision follows etcd's revision compactor: every 5 minutes, keep
// the last N revisions; an unchanged target is not compacted again, and a
// store already compacted past it counts as done.
func TestRevision(t *testing.T) {
	s := open(t)
	put(t, s, 20) // revision 21
	fc := fakeclock.New(time.Unix(1_700_000_000, 0))
	core, logs := observer.New(zap.InfoLevel)
	c := autocompact.Start(autocompact.Config{Mode: autocompact.Revision, Revisions: 5, Clock: fc, Logger: zap.New(core)}, s,
		func() bool { return true })
	defer c.Stop()
	fc.BlockUntil(t, 1)
	fc.Advance(autocompact.RevisionInterval - time.Second)
	fc.BlockUntil(t, 1)
	if got := compacted(t, s); got > 0 {
		t.Fatalf("compacted to %d before the interval", got)
	}
	fc.Advance(time.Second)
	fc.BlockUntil(t, 1)
	if got := compacted(t, s); got != 16 {
		t.Fatalf("compacted to %d, want 21-5", got)
	}
	put(t, s, 3) // revision 24
	if _, err := s.Compact(context.Background(), &pb.CompactionRequest{Revision: 22}); err != nil {
		t.Fatal(err)
	}
	fc.Advance(autocompact.RevisionInterval)
	fc.BlockUntil(t, 1)
	if got := compacted(t, s); got != 22 {
		t.Fatalf("compacted to %d, want 22 (the loop's 19 is already compacted)", got)
	}
	if n := logs.FilterMessage("completed auto revision compaction").Len(); n != 2 {
		t.Fatalf("%d completed compactions logged, want 2 (already compacted counts, as in etcd)", n)
	}
	if n := logs.FilterMessage("failed auto revision compaction").Len(); n != 0 {
		t.Fatalf("%d failures logged", n)
	}
}

// TestDisabled: a zero retention starts nothing.
func TestDisabled(t *testing.T) {
	c := autocompact.Start(autocompact.Config{Mode: autocompact.Periodic}, open(t), func() bool { return true })
	c.Stop()
}
