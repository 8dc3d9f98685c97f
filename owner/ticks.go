package owner

import (
	"sync"
	"time"
)

// A process's electors tick on one loop of the process rather than each on
// a timer and goroutine of its own. Their ticks fall on the same instants
// either way (multiples of RenewInterval, so that their reads meet in the
// store's shared transactions), but a thousand electors each woken every
// interval, most of them to find that their process's beat renews them and
// there is nothing to read, were 17 % of a FoundationDB process's CPU
// profile at rest, and on Pebble 1.8 % of a core against 1.1 % on this
// loop (1,000 quiet tenants, tenant's BenchmarkQuietTenants).
//
// The loop asks each elector whether it has a read to do (Elector.due) and
// starts a goroutine for those that have, which it waits for before it
// sleeps again, so an interval's reads still arrive together. So one slow
// round delays the next for every elector of the process, by at most a
// tick's deadline (TTL) and a shared transaction's bound: the owners'
// holdings do not wait for it (the beats run on a loop of their own), a
// follower's reading of a lapsed owner may.

// join adds e to the electors the loop ticks.
func (p *Process) join(e *Elector) {
	p.electorsMu.Lock()
	defer p.electorsMu.Unlock()
	p.electors[e] = struct{}{}
}

// leave removes e. The loop claims ticks under electorsMu, so none of e
// starts after leave returns; one already started may still run
// (Elector.Stop waits for it).
func (p *Process) leave(e *Elector) {
	p.electorsMu.Lock()
	defer p.electorsMu.Unlock()
	delete(p.electors, e)
}

// wakeTicks asks the loop for the ticks its electors' Refresh asked for.
func (p *Process) wakeTicks() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// tickElectors is the loop: at every multiple of RenewInterval it ticks
// every elector, and in between, at most refreshGap times an interval, the
// electors that asked to read their record (Refresh).
func (p *Process) tickElectors() {
	defer close(p.ticksDone)
	clk, iv := p.cfg.Clock, p.cfg.RenewInterval
	last := clk.Now()
	for {
		next := alignedAfter(last, iv)
		var ok bool
		if last, ok = pace(clk, iv, last, next.Sub(clk.Now()), p.stop, p.wake); !ok {
			return
		}
		p.tickRound(!last.Before(next), last)
	}
}

// tickRound runs the ticks due now, every elector's (all) or only those
// that asked to read, concurrently, and returns when they are done.
func (p *Process) tickRound(all bool, now time.Time) {
	var wg sync.WaitGroup
	p.electorsMu.Lock()
	for e := range p.electors {
		if e.claimTick(all, now) {
			wg.Go(func() {
				defer e.ticks.Done()
				e.tick()
			})
		}
	}
	p.electorsMu.Unlock()
	wg.Wait()
}

// claimTick says whether the loop should tick e now: on every round of
// all or when e asked to read (Refresh), if it has a read to do. A claimed
// tick is counted in e.ticks. Called with the process's electorsMu held.
func (e *Elector) claimTick(all bool, now time.Time) bool {
	asked := false
	select {
	case <-e.refresh:
		asked = true
	default:
	}
	if !all && !asked {
		return false
	}
	if _, due := e.due(now); !due {
		return false
	}
	e.ticks.Add(1)
	return true
}
