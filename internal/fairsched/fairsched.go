// Package fairsched shares a process's request evaluation out among
// tenants. A Scheduler runs at most Slots pieces of work at once; past
// that, each tenant's work waits in a queue of its own and the queues are
// served in deficit-round-robin order, so that a tenant with one request
// waiting is served after at most one turn of every other backlogged
// tenant, however many requests those have queued. Below Slots nothing
// waits and nothing is reordered: a tenant alone gets every slot.
//
// The scheduler has no goroutine: a finishing piece of work hands its slot
// to the next waiter itself.
package fairsched

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
)

// Defaults of Config.
const (
	DefaultQueue   = 1024
	DefaultMaxWait = 5 * time.Second
	DefaultQuantum = 1
)

// ErrTooManyRequests is what a piece of work gets when its tenant's queue
// is full or it waited MaxWait: etcd's own "too many requests", which
// clientv3 does not retry.
var ErrTooManyRequests = rpctypes.ErrGRPCRequestTooManyRequests

// Config configures a Scheduler.
type Config struct {
	// Slots is how many pieces of work run at once; must be > 0.
	Slots int
	// Queue bounds the pieces of work one tenant has waiting; the one past
	// it fails at once. 0 means DefaultQueue.
	Queue int
	// MaxWait bounds how long a piece of work waits for a slot. 0 means
	// DefaultMaxWait.
	MaxWait time.Duration
	// Quantum is the cost a tenant may spend per turn; 0 means
	// DefaultQuantum. Work costing more than a quantum waits for as many
	// turns as it needs.
	Quantum int
	// Clock times the waits; nil means clock.Real.
	Clock clock.Clock
}

// Scheduler admits work per tenant; the zero value is not usable (New).
type Scheduler struct {
	cfg Config

	mu      sync.Mutex
	running int              // guarded by mu: slots in use
	flows   map[string]*flow // guarded by mu: tenants with work waiting
	ring    []*flow          // guarded by mu: the same, in round-robin order
	next    int              // guarded by mu: index in ring of the flow served next
}

// flow is one tenant's waiting work.
type flow struct {
	name    string
	waiting []*waiter // FIFO, at most cfg.Queue
	deficit int       // cost it may still spend in its turn
	turn    bool      // its turn has begun (deficit holds this turn's quantum)
}

// waiter is one piece of work waiting for a slot.
type waiter struct {
	cost    int
	granted chan struct{} // closed, under mu, when it got a slot
}

// New returns a scheduler with cfg's limits.
func New(cfg Config) *Scheduler {
	if cfg.Slots <= 0 {
		cfg.Slots = 1
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Quantum <= 0 {
		cfg.Quantum = DefaultQuantum
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Scheduler{cfg: cfg, flows: make(map[string]*flow)}
}

// Acquire waits for a slot for one piece of tenant's work costing cost (at
// least 1) and returns the function that gives it back, which must be
// called exactly once. It fails with ctx's gRPC status if ctx ends first,
// or ErrTooManyRequests if the tenant's queue is full or the wait reached
// MaxWait.
func (s *Scheduler) Acquire(ctx context.Context, tenant string, cost int) (release func(), err error) {
	s.mu.Lock()
	if s.running < s.cfg.Slots && len(s.ring) == 0 {
		s.running++
		s.mu.Unlock()
		return s.release, nil
	}
	f := s.flows[tenant]
	if f != nil && len(f.waiting) >= s.cfg.Queue {
		s.mu.Unlock()
		return nil, ErrTooManyRequests
	}
	if f == nil {
		f = &flow{name: tenant}
		s.flows[tenant] = f
		s.ring = append(s.ring, f)
	}
	w := &waiter{cost: max(cost, 1), granted: make(chan struct{})}
	f.waiting = append(f.waiting, w)
	// A slot may be free with others waiting only between a release and
	// the grants it makes, which happen under mu: dispatch is a no-op
	// unless this waiter can run now.
	s.dispatch()
	s.mu.Unlock()

	s.cfg.Clock.Sleep(s.cfg.MaxWait, ctx.Done(), w.granted)

	s.mu.Lock()
	defer s.mu.Unlock()
	if isClosed(w.granted) {
		if ctx.Err() == nil {
			return s.release, nil
		}
		s.running--
		s.dispatch()
	} else {
		s.drop(f, w)
	}
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, ErrTooManyRequests
}

// release gives a slot back and hands it on.
func (s *Scheduler) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.dispatch()
}

// dispatch grants free slots to waiters in deficit-round-robin order.
// Called with mu held.
func (s *Scheduler) dispatch() {
	for s.running < s.cfg.Slots && len(s.ring) > 0 {
		f := s.ring[s.next]
		if !f.turn {
			f.deficit += s.cfg.Quantum
			f.turn = true
		}
		w := f.waiting[0]
		if f.deficit < w.cost {
			// Its turn is spent; the deficit carries over to its next.
			f.turn = false
			s.next = (s.next + 1) % len(s.ring)
			continue
		}
		f.deficit -= w.cost
		f.waiting = f.waiting[1:]
		s.running++
		close(w.granted)
		if len(f.waiting) == 0 {
			s.remove(s.next)
		}
	}
}

// drop takes a waiter that gave up out of f. Called with mu held.
func (s *Scheduler) drop(f *flow, w *waiter) {
	for i, x := range f.waiting {
		if x == w {
			f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
			break
		}
	}
	if len(f.waiting) > 0 {
		return
	}
	for i, x := range s.ring {
		if x == f {
			s.remove(i)
			return
		}
	}
}

// remove takes the idle flow at ring index i out of the ring and the map:
// an idle tenant keeps no state and no credit. Called with mu held.
func (s *Scheduler) remove(i int) {
	delete(s.flows, s.ring[i].name)
	s.ring = append(s.ring[:i], s.ring[i+1:]...)
	if i < s.next {
		s.next--
	}
	if s.next >= len(s.ring) {
		s.next = 0
	}
}

// Stats is a snapshot of the scheduler's state.
type Stats struct {
	Running int // slots in use
	Waiting int // pieces of work waiting
	Tenants int // tenants with work waiting
}

// Stats returns the scheduler's current state.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Running: s.running, Tenants: len(s.ring)}
	for _, f := range s.ring {
		st.Waiting += len(f.waiting)
	}
	return st
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
