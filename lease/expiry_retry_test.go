package lease

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
)

// failingRevokes fails every revoke of the leases in fail, as a revoke that
// keeps timing out would, and counts the attempts.
type failingRevokes struct {
	*mvcc.Store
	fail  map[int64]bool
	mu    sync.Mutex
	tries map[int64]int
}

func (f *failingRevokes) Revoke(ctx context.Context, r *mvcc.RevokeRequest) (*pb.LeaseRevokeResponse, error) {
	if f.fail[r.ID] {
		f.mu.Lock()
		f.tries[r.ID]++
		f.mu.Unlock()
		return nil, fmt.Errorf("lease %d: %w", r.ID, mvcc.ErrTimeout)
	}
	return f.Store.Revoke(ctx, r)
}

// TestFailingExpiryBacksOff: leases whose revoke keeps failing are retried
// with a doubling delay rather than on every pass, and do not hold up the
// leases behind them, even when they fill the whole expiry window.
func TestFailingExpiryBacksOff(t *testing.T) {
	w := newWorld(t, nil)
	store, err := mvcc.Open(w.db, mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fr := &failingRevokes{Store: store, fail: map[int64]bool{1: true, 2: true, 3: true}, tries: map[int64]int{}}
	n := &node{w: w, store: store, clk: fakeclock.New(w.now), db: &crashable{DB: w.db}}
	c := w.cfg(Config{ExpireBatch: 3})
	c.Clock = n.clk
	n.own = owner.Start(n.db, owner.Config{TTL: 5 * time.Second, Clock: n.clk, Logger: c.Logger})
	n.l = New(fr, n.own, c)
	w.nodes = append(w.nodes, n)
	n.clk.BlockUntil(t, loops)
	for id := int64(1); id <= 10; id++ {
		n.grant(t, id, 5)
		n.put(t, fmt.Sprintf("k/%d", id), id)
	}
	w.step(65*time.Second, 250*time.Millisecond)
	for id := int64(4); id <= 10; id++ {
		if n.alive(t, id) {
			t.Fatalf("lease %d still alive behind the failing ones", id)
		}
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for id := int64(1); id <= 3; id++ {
		// Due from 5 s on; retried after 1, 2, 4, 8, 16 and 32 s: 7 tries
		// in the 60 s since (every pass, 240 of them, without the backoff).
		if got := fr.tries[id]; got < 2 || got > 8 {
			t.Fatalf("lease %d: %d revoke attempts in 60 s, want about 7", id, got)
		}
	}
	t.Logf("revoke attempts of the failing leases: %v", fr.tries)
}
