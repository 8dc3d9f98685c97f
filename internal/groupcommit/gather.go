package groupcommit

import "time"

// Closed-loop clients make batches alternate in size. When a batch of n is
// answered, nothing is queued (its n callers were all in it); the first of
// them back leads a batch of one at once, and the other n-1, back a moment
// later, queue behind it and wait for two commits instead of one. Each
// request then pays about two batches, and the store commits twice as
// often as it needs to.
//
// So a leader that finds fewer requests queued than its previous batch took
// waits, briefly, for them: until as many are queued as that batch held, or
// until the window after that batch's answers closes — Gather, and no more
// than half of what the batch took to commit, so that a wrong guess costs
// a lone request at most half a commit, where a right one saves it a whole
// batch. A leader that arrives after the window (a lone client, a quiet
// spell) does not wait at all, nor does one that finds its previous batch
// already matched.

// gathering is what a queue knows of its previous batch; every field is
// guarded by the queue's mu.
type gathering struct {
	expect int           // the previous batch's size
	until  time.Time     // when the window after its answers closes
	want   int           // the queue length that ends a leader's wait
	full   chan struct{} // closed when want is reached; nil while no leader waits
}

// committed records a batch of n that took from began to ended to commit.
func (g *gathering) committed(n int, began, ended time.Time, max time.Duration) {
	g.expect = n
	g.until = ended.Add(min(max, ended.Sub(began)/2))
}

// arrived tells a waiting leader that queued requests are now queued.
func (g *gathering) arrived(queued int) {
	if g.full != nil && queued >= g.want {
		g.wakeLeader()
	}
}

// wakeLeader ends a leader's wait.
func (g *gathering) wakeLeader() {
	if g.full != nil {
		close(g.full)
		g.full = nil
	}
}

// awaitGathered waits, if the queue should gather (see above), until as
// many requests are queued as the previous batch took, or its window
// closes. The caller leads and holds mu, which is released during the
// wait.
func (q *Queue[Req, Resp]) awaitGathered() {
	g := &q.gather
	want := g.expect
	if q.limits.MaxBatch > 0 {
		want = min(want, q.limits.MaxBatch)
	}
	if q.limits.Gather <= 0 || q.stopped || len(q.waiting) >= want {
		return
	}
	wait := g.until.Sub(q.limits.Clock.Now())
	if wait <= 0 {
		return
	}
	g.want, g.full = want, make(chan struct{})
	full := g.full
	q.mu.Unlock()
	q.limits.Clock.Sleep(wait, nil, full)
	q.mu.Lock()
	g.full = nil
}
