package mvcc

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// TestAbandonedReadPinExpires: a read pin holds physical compaction at its
// floor, but one left behind by a process that stopped holds it only for
// ReadPinWindow after the compactor first saw it; the compactor then clears
// it, and the Range that wrote it no longer relies on it.
func TestAbandonedReadPinExpires(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(time.Unix(1000, 0))
	const window = time.Minute
	s := openInternal(t, testdb.Open(t), Config{Now: clock.Now, SoleWriter: true, ReadPinWindow: window})
	for i := 0; i < 4; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	pin, err := s.pinReads(ctx) // never removed
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: 5}); err != nil {
		t.Fatal(err)
	}
	seen := newHoldersSeen()
	target, later, err := s.compactTarget(ctx, seen)
	if err != nil || target > pin.floor || later != pinPoll {
		t.Fatalf("with the pin at %d: target %d, wait %v (%v); want at most the pin and %v", pin.floor, target, later, err, pinPoll)
	}
	if !s.compactTo(ctx, target) {
		t.Fatal("store closed")
	}
	if n := historyVersions(t, s, "k"); n != 4 {
		t.Fatalf("%d versions of k under the pin, want 4", n)
	}
	clock.Advance(window - time.Millisecond)
	if !s.pinLive(pin) {
		t.Fatal("the pin's Range stopped relying on it before the window passed")
	}
	if target, _, err = s.compactTarget(ctx, seen); err != nil || target > pin.floor {
		t.Fatalf("just before the window passed: target %d (%v)", target, err)
	}
	clock.Advance(time.Millisecond)
	if s.pinLive(pin) {
		t.Fatal("the pin's Range still relies on it once the compactor may clear it")
	}
	if target, later, err = s.compactTarget(ctx, seen); err != nil || target != 5 || later != 0 {
		t.Fatalf("once the window passed: target %d, wait %v (%v), want 5 and 0", target, later, err)
	}
	if !s.compactTo(ctx, target) {
		t.Fatal("store closed")
	}
	if n := historyVersions(t, s, "k"); n != 1 {
		t.Fatalf("%d versions of k after physical compaction to 5, want 1", n)
	}
	b, e := keyspace.ReadPins()
	if err := s.db.View(ctx, func(tx storage.ReadTx) error {
		pins, err := tx.GetRange(b, e, storage.RangeOptions{})
		if len(pins) != 0 {
			t.Errorf("%d read pins left after the window", len(pins))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
