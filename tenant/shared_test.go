package tenant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// countedDB counts the transactions run on the shared store, and makes
// each take at least hold, so that the calls arriving together queue
// behind the first whatever the machine's scheduling. It records how many
// keys each transaction's first GetMany read.
type countedDB struct {
	storage.DB
	hold    time.Duration
	updates atomic.Int64

	mu    sync.Mutex
	reads [][]int // guarded by mu: per Update, in order, the size of each GetMany of its attempts
}

func (d *countedDB) Update(ctx context.Context, fn func(tx storage.Tx) error) error {
	d.mu.Lock()
	d.updates.Add(1)
	i := len(d.reads)
	d.reads = append(d.reads, nil)
	d.mu.Unlock()
	time.Sleep(d.hold)
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		return fn(&countReadTx{Tx: tx, record: func(n int) {
			d.mu.Lock()
			d.reads[i] = append(d.reads[i], n)
			d.mu.Unlock()
		}})
	})
}

// readsSince returns the sizes of the GetMany calls of each Update from
// the n-th on.
func (d *countedDB) readsSince(n int) [][]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([][]int(nil), d.reads[n:]...)
}

// countReadTx reports the size of each GetMany.
type countReadTx struct {
	storage.Tx
	record func(n int)
}

func (t *countReadTx) GetMany(keys [][]byte) ([][]byte, error) {
	t.record(len(keys))
	return t.Tx.GetMany(keys)
}

// sharedTenants creates n tenants in a fresh store whose keyspaces share
// transactions, and returns them with the counted shared store.
func sharedTenants(t *testing.T, n int, hold time.Duration) ([]*DB, *countedDB, *Registry) {
	t.Helper()
	inner := testdb.Open(t)
	reg := NewRegistry(inner)
	counted := &countedDB{DB: inner, hold: hold}
	shared := newSharedUpdates(counted)
	dbs := make([]*DB, n)
	for i := range dbs {
		rec, err := reg.Create(ctxT(t), fmt.Sprintf("t%d", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		dbs[i] = newDB(counted, rec.ID, Quotas{}, shared)
	}
	return dbs, counted, reg
}

// TestRunningTenantsRenewTogether: the ownership renewals of a process's
// running tenants, started at different times, tick together at
// multiples of the renew interval and commit in shared transactions: a
// couple of transactions per interval for all of them, not one each.
// Every tenant still holds its ownership throughout.
func TestRunningTenantsRenewTogether(t *testing.T) {
	const (
		tenants   = 10
		renew     = time.Second
		intervals = 6
		step      = renew / tenants
	)
	dbs, counted, _ := sharedTenants(t, tenants, 20*time.Millisecond)
	clk := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	electors := make([]*owner.Elector, tenants)
	for i, db := range dbs {
		// Staggered starts: left to their own phase, the tenants would
		// tick one step apart.
		electors[i] = owner.Start(db, owner.Config{TTL: 4 * renew, RenewInterval: renew, Clock: clk})
		t.Cleanup(electors[i].Stop)
		clk.BlockUntil(t, i+1)
		clk.Advance(step)
		clk.BlockUntil(t, i+1)
	}
	epochs := make([]uint64, tenants)
	for i, e := range electors {
		v := e.View()
		if !v.Held {
			t.Fatalf("tenant %d's elector does not own its vacant keyspace at its start", i)
		}
		epochs[i] = v.Epoch
	}

	counted.updates.Store(0)
	for range intervals * tenants {
		clk.Advance(step)
		clk.BlockUntil(t, tenants)
	}
	if n := counted.updates.Load(); n > 3*intervals {
		t.Errorf("%d tenants renewing over %d intervals ran %d transactions of the shared store; want at most %d (a few per interval)",
			tenants, intervals, n, 3*intervals)
	}
	for i, e := range electors {
		if v := e.View(); !v.Held || v.Epoch != epochs[i] {
			t.Errorf("tenant %d after %d intervals: %+v; want still holding epoch %d", i, intervals, v, epochs[i])
		}
	}
}

// TestSharedUpdateMemberFailsAlone: in one shared transaction, a member
// whose function fails and a member whose tenant was deleted meanwhile are
// answered with their own errors and write nothing; the others commit.
func TestSharedUpdateMemberFailsAlone(t *testing.T) {
	ctx := ctxT(t)
	dbs, counted, reg := sharedTenants(t, 4, 0)
	if err := reg.Delete(ctx, "t2"); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	key := []byte("k")

	// The first call holds the lead until the others are queued, so that
	// they share the next transaction.
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		var once sync.Once
		first <- dbs[0].UpdateShared(ctx, nil, nil, func(tx, _ storage.Tx) error {
			once.Do(func() { close(started) })
			<-release
			tx.Set(key, []byte("0"))
			return nil
		})
	}()
	<-started
	var wg sync.WaitGroup
	errs := make([]error, len(dbs))
	for i := 1; i < len(dbs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = dbs[i].UpdateShared(ctx, [][]byte{key}, nil, func(tx, _ storage.Tx) error {
				if _, err := tx.Get(key); err != nil {
					return err
				}
				want := []byte{byte('0' + i)}
				tx.Set(key, want)
				if i == 1 {
					return boom // after writing: the write must not land
				}
				// A member reads its own writes.
				if got, err := tx.Get(key); err != nil || !bytes.Equal(got, want) {
					return fmt.Errorf("tenant %d read back %q, %v after writing %q", i, got, err, want)
				}
				return nil
			})
		}()
	}
	// Long enough for the three to queue (their sharing is checked below).
	time.Sleep(300 * time.Millisecond)
	before := int(counted.updates.Load())
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("the first call: %v", err)
	}
	if !errors.Is(errs[1], boom) || !errors.Is(errs[2], ErrDeleted) || errs[3] != nil {
		t.Fatalf("members' answers %v; want boom, ErrDeleted and nil", errs[1:])
	}
	// The first shared transaction reads the three members' key and
	// fence in one batch (6 keys), and nothing more: the members' own
	// reads of them are answered from it.
	if got := counted.readsSince(before); len(got) == 0 || !slices.Equal(got[0], []int{6}) {
		t.Errorf("the queued members' transactions read %v keys; want the first to read 6 keys once", got)
	}
	want := map[int]string{0: "0", 1: "", 3: "3"}
	for i, w := range want {
		var got []byte
		if err := dbs[i].View(ctx, func(tx storage.ReadTx) error {
			var err error
			got, err = tx.Get(key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if string(got) != w {
			t.Errorf("tenant %d's key is %q; want %q", i, got, w)
		}
	}
}

// TestProcessBeatRenewsRunningTenants: with the process beating for its
// running tenants (owner.Process), their renewals write nothing: over
// several intervals the owning process runs one transaction per interval,
// its beat, however many tenants, while another process's electors,
// reading the owner's beat through their shared transactions, never take
// a tenant over.
func TestProcessBeatRenewsRunningTenants(t *testing.T) {
	const (
		tenants   = 10
		renew     = time.Second
		intervals = 6 // more than TTL: a standing record alone would be taken over
	)
	dbs, counted, reg := sharedTenants(t, tenants, 0)
	clk := fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := owner.Config{TTL: 4 * renew, RenewInterval: renew, Clock: clk}
	// b, another process, has its own queue of shared transactions, whose
	// transactions take long enough for an interval's reads to meet.
	bCounted := &countedDB{DB: counted.DB, hold: 20 * time.Millisecond}
	bShared := newSharedUpdates(bCounted)
	a, b := owner.StartProcess(counted, cfg), owner.StartProcess(bCounted, cfg)
	t.Cleanup(a.Stop)
	t.Cleanup(b.Stop)
	loops := 4 // each process's beats and ticks; the electors tick on them
	clk.BlockUntil(t, loops)
	owners, others := make([]*owner.Elector, tenants), make([]*owner.Elector, tenants)
	for i, db := range dbs {
		cfg.Process, cfg.URL = a, "http://a"
		owners[i] = owner.Start(db, cfg)
		t.Cleanup(owners[i].Stop)
		rec, err := reg.Get(ctxT(t), fmt.Sprintf("t%d", i))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Process, cfg.URL = b, "http://b"
		others[i] = owner.Start(newDB(bCounted, rec.ID, Quotas{}, bShared), cfg)
		t.Cleanup(others[i].Stop)
		clk.BlockUntil(t, loops)
	}
	counted.updates.Store(0)
	bCounted.updates.Store(0)
	for range intervals {
		clk.Advance(renew)
		clk.BlockUntil(t, loops)
	}
	if n := counted.updates.Load(); n > intervals {
		t.Errorf("the owner of %d tenants ran %d transactions over %d intervals; want its beats alone (%d)",
			tenants, n, intervals, intervals)
	}
	// b's electors read every interval, together: its beat and a few
	// shared transactions per interval (the first reader's, then the
	// rest's), not one per tenant.
	if n := bCounted.updates.Load(); n > 5*intervals {
		t.Errorf("the other process ran %d transactions over %d intervals for %d tenants; want at most %d",
			n, intervals, tenants, 5*intervals)
	}
	for i, e := range owners {
		if v := e.View(); !v.Held || v.Epoch != 1 || v.ID != a.ID() {
			t.Errorf("tenant %d after %d intervals: %+v; want a still holding epoch 1", i, intervals, v)
		}
		if v := others[i].View(); v.Held || v.ID != a.ID() {
			t.Errorf("tenant %d, the other process after %d intervals: %+v; want a's record", i, intervals, v)
		}
	}
}
