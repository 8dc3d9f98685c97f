// Package owner elects the one fdb-etcd replica that commits writes and
// expires leases. Several replicas share a store; each write batch reads and
// bumps the global revision, so batches committed by several replicas at
// once conflict and retry (measured on FoundationDB: three replicas writing
// together did under half the puts of one and starved one of them), and a
// lease must be expired by one replica only. So one replica at a time owns
// both: the others forward their writes to it (server/forward), and only it
// revokes due leases (package lease).
//
// The owner is the record under one singleton key: member id, epoch, a beat
// and the URL the others forward to. The owner rewrites it (a new beat)
// every RenewInterval. Every replica reads it as often; one that has seen
// the same bytes for TTL, by its own monotonic clock, takes over with the
// next epoch in a transaction that re-reads the record, so two replicas never
// take the same epoch. No wall-clock time is stored or compared: a replica
// only measures how long it has itself watched the record stand still, so
// clock skew between replicas does not move the hand-over.
//
// Many keyspaces in one store (package tenant) share their owners'
// liveness instead: each keyspace's record names the owning process and
// stands still while the process beats for all of them (Process).
//
// Fencing. The epoch fences what must be done by one replica only: a lease
// expiry checks Fence in its own transaction, so an owner that was deposed
// while it paused never deletes. Forwarded writes need no fence: the store's
// serializable transactions keep them correct whoever commits them, and a
// replica that believes itself owner for a moment too long merely conflicts.
package owner

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// ErrNotOwner is Fence's answer when the record names another owner or
// another epoch.
var ErrNotOwner = errors.New("owner: this replica does not own the epoch")

// Config configures a replica's part in the election.
type Config struct {
	// URL is where the others reach this replica's etcd API to forward
	// writes ("" if they cannot).
	URL string
	// TTL is how long a record may stand still before another replica
	// takes over: the longest an owner's death stalls lease expiry and sends
	// writes to a dead replica. Default 3 s.
	TTL time.Duration
	// RenewInterval is how often the owner renews and the others read the
	// record; default TTL/4, at most TTL/2.
	RenewInterval time.Duration
	Clock         clock.Clock
	Logger        *zap.Logger
	// Process, on a store that is a SharedUpdater, is the process this
	// replica's keyspace shares its liveness with: its record then names
	// the process and stands still while the process beats (Process).
	// The Process's TTL, RenewInterval and Clock must be this Config's.
	Process *Process
}

func (c *Config) defaults() {
	if c.TTL <= 0 {
		c.TTL = 3 * time.Second
	}
	if c.RenewInterval <= 0 || c.RenewInterval > c.TTL/2 {
		c.RenewInterval = c.TTL / 4
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// SharedUpdater is an optional capability of the store an Elector runs on:
// one of many keyspaces sharing a store (package tenant) runs its
// renewals in transactions of that store shared with the other keyspaces'
// (keys are read first, with theirs). A thousand keyspaces each renewing
// in a transaction of its own were most of a process's CPU at rest. On
// such a store the Elector ticks at multiples of RenewInterval on its
// clock (on its Process's loop, with one), so that the keyspaces'
// renewals of one interval arrive together.
type SharedUpdater interface {
	// UpdateShared runs fn like Update, in a transaction it may share with
	// other keyspaces': tx is on the keyspace's keys, outer on the
	// shared store's own (its processes' beats). keys, in the keyspace,
	// and outerKeys, in the shared store, are read first, with the other
	// members' keys.
	UpdateShared(ctx context.Context, keys, outerKeys [][]byte, fn func(tx, outer storage.Tx) error) error
}

// verifyEvery is how many intervals an owner whose process beats for it
// goes without reading its record. The deposal marks tell the process of
// every takeover by a replica of this version; this read finds the others
// (an earlier version's replica, which writes no mark, taking over during
// an upgrade), which otherwise cost conflicts until the process restarts.
const verifyEvery = 8

// View is what a replica currently believes about ownership.
type View struct {
	// Held: this replica owns Epoch.
	Held  bool
	Epoch uint64
	// ID and URL name the owner while one is alive (this replica if Held);
	// zero when the record is vacant or has stood still for TTL.
	ID  uint64
	URL string
}

// Elector keeps this replica's view of the owner current, renewing its
// ownership or taking over a vacant or lapsed one.
type Elector struct {
	db  storage.DB
	cfg Config
	id  uint64 // this process's id in the record: random, never a member's

	clock clock.Clock
	lg    *zap.Logger
	// shared is db as a SharedUpdater, nil if it is not one: ticks then
	// run in shared transactions, at aligned instants.
	shared SharedUpdater

	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{} // closed when run returns (never, on a Process's loop)
	once   sync.Once
	// refresh asks the loop to read the record now (Refresh); it holds at
	// most one request, so asking again before the read adds nothing.
	refresh chan struct{}
	// ticks counts the ticks the Process's loop started and that have not
	// finished (ticks.go); Stop waits for them.
	ticks sync.WaitGroup

	mu      sync.Mutex
	seen    []byte        // guarded by mu: the record's bytes as last read
	seenAt  time.Time     // guarded by mu: when those bytes were first read
	rec     record        // guarded by mu: seen, decoded
	held    uint64        // guarded by mu: the epoch this process holds, 0 if none
	renewed time.Time     // guarded by mu: start of the last committed renewal
	changed chan struct{} // guarded by mu: closed when held or the owner changes
	// proc beats for this keyspace while this replica holds it (nil
	// without a Process or off a shared store).
	proc *Process
	// verifiedGen is proc's deposal generation before the last read of
	// the record that found this replica holding it; verifiedAt that
	// read's start. proc's beats renew the holding while its generation
	// is still verifiedGen.
	verifiedGen uint64    // guarded by mu
	verifiedAt  time.Time // guarded by mu
}

// Start reads (and, if vacant, takes) ownership once, then keeps renewing or
// watching it until Stop.
func Start(db storage.DB, cfg Config) *Elector {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{
		db: db, cfg: cfg, id: newID(), clock: cfg.Clock, lg: cfg.Logger,
		ctx: ctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}),
		refresh: make(chan struct{}, 1), changed: make(chan struct{}),
	}
	e.shared, _ = db.(SharedUpdater)
	if cfg.Process != nil && e.shared != nil {
		e.proc, e.id = cfg.Process, cfg.Process.ID()
	}
	e.tick()
	if e.proc != nil {
		// No timer and goroutine of its own: the process's loop ticks
		// all its electors (ticks.go).
		e.proc.join(e)
	} else {
		go e.run()
	}
	return e
}

// ID is this process's id in the record (its Process's, with one). It is
// drawn at random for each process rather than derived from the member's
// name: two processes given
// the same name by mistake must not take ownership from each other, and a
// restarted member must not mistake its dead predecessor's record for its
// own.
func (e *Elector) ID() uint64 { return e.id }

func newID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 && id != unreadable {
			return id
		}
	}
}

func (e *Elector) run() {
	defer close(e.done)
	last := e.clock.Now()
	for {
		var ok bool
		if last, ok = pace(e.clock, e.cfg.RenewInterval, last, e.untilTick(last), e.stop, e.refresh); !ok {
			return
		}
		e.tick()
	}
}

// pace waits for a loop's next round, the last one having started at
// last: until due (from now), or sooner when wake holds a request, but
// never less than interval/refreshGap after last. Refreshes come from
// writes, thousands a second while an owner is unreachable: they start a
// round at most every refreshGap. It returns the new round's start, which
// serves any request on wake made before it, and false once stop is
// closed.
func pace(clk clock.Clock, interval time.Duration, last time.Time, due time.Duration, stop <-chan struct{}, wake chan struct{}) (time.Time, bool) {
	clk.Sleep(due, stop, wake)
	if wait := interval/refreshGap - clk.Now().Sub(last); wait > 0 {
		clk.Sleep(wait, stop, nil)
	}
	select {
	case <-stop:
		return time.Time{}, false
	default:
	}
	select {
	case <-wake:
	default:
	}
	return clk.Now(), true
}

// untilTick is how long after now the next tick is due, the last one
// having started at last: RenewInterval after it, or, on a shared store, at
// the first multiple of RenewInterval after it (alignedAfter).
func (e *Elector) untilTick(last time.Time) time.Duration {
	if e.shared == nil {
		return e.cfg.RenewInterval - e.clock.Now().Sub(last)
	}
	return alignedAfter(last, e.cfg.RenewInterval).Sub(e.clock.Now())
}

// alignedAfter is the first multiple of interval after last: the same
// instant for every keyspace of the process, and of any process whose
// clock agrees.
func alignedAfter(last time.Time, interval time.Duration) time.Time {
	return last.Truncate(interval).Add(interval)
}

// update runs a tick's transaction: in a shared transaction on a shared
// store, else in one of its own (without the shared store's keys: outer
// is nil).
func (e *Elector) update(ctx context.Context, outerKeys [][]byte, fn func(tx, outer storage.Tx) error) error {
	if e.shared != nil {
		return e.shared.UpdateShared(ctx, [][]byte{key}, outerKeys, fn)
	}
	return e.db.Update(ctx, func(tx storage.Tx) error { return fn(tx, nil) })
}

// refreshGap is how many reads of the record Refresh may add per
// RenewInterval.
const refreshGap = 8

// View returns the current belief. This replica holds its epoch until TTL
// after the start of its last committed renewal (or of its process's last
// beat, while no takeover has been seen since the record was last read);
// another replica's record is believed until it has stood still for TTL.
func (e *Elector) View() View {
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	renewed := e.renewed
	if e.proc != nil && e.rec.Process {
		if beat, gen := e.proc.renewal(); gen == e.verifiedGen && beat.After(renewed) {
			renewed = beat
		}
	}
	if e.held != 0 && now.Sub(renewed) < e.cfg.TTL {
		return View{Held: true, Epoch: e.held, ID: e.id, URL: e.cfg.URL}
	}
	if e.rec.ID != 0 && e.rec.ID != e.id && now.Sub(e.seenAt) < e.cfg.TTL {
		return View{Epoch: e.rec.Epoch, ID: e.rec.ID, URL: e.rec.URL}
	}
	return View{}
}

// Refresh asks for the record to be read now rather than at the next
// RenewInterval, without waiting for it (Changed tells of what it finds).
// A replica that finds the owner it believes in unreachable asks it: the
// owner may have died and another taken over since the last read, and
// until this replica reads that, it commits its writes itself, racing the
// new owner's stream of commits on the head revision.
func (e *Elector) Refresh() {
	e.mu.Lock()
	e.verifiedAt = time.Time{} // an owner whose process beats for it reads too
	e.mu.Unlock()
	select {
	case e.refresh <- struct{}{}:
	default:
	}
	if e.proc != nil {
		e.proc.wakeTicks()
	}
}

// Changed returns a channel closed at the next change of the owner or of
// this replica's epoch. Take it before View, so that no change falls
// between the two.
func (e *Elector) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}

// Fence fails with ErrNotOwner unless tx sees this replica owning epoch.
// Called inside a transaction that must commit only under that ownership,
// it makes the transaction conflict with any takeover. Failing, it asks
// for the record to be read again (Refresh): the caller believed in an
// ownership that is gone, and its view should not wait for the next
// scheduled read to say so.
func (e *Elector) Fence(tx storage.ReadTx, epoch uint64) error {
	v, err := tx.Get(key)
	if err != nil {
		return err
	}
	r, err := decode(v)
	if err != nil || r.ID != e.id || r.Epoch != epoch {
		e.Refresh()
		return ErrNotOwner
	}
	return nil
}

// Stop ends the loop and hands ownership back, so that the next owner need
// not wait out the TTL.
func (e *Elector) Stop() {
	e.once.Do(func() {
		close(e.stop)
		if e.proc != nil {
			e.proc.leave(e) // no tick of e starts after it
			e.ticks.Wait()
		} else {
			<-e.done
		}
		e.cancel()
		e.release()
	})
}
