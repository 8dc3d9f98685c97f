// Package ownertest is a view of ownership that a test sets by hand, for
// the packages that follow the owner (forwarding, the commit feed) without
// running an election.
package ownertest

import (
	"sync"

	"github.com/fdb-etcd/fdb-etcd/owner"
)

// Views holds a View and closes Changed at each Set, as owner.Elector does
// at each change of the owner.
type Views struct {
	mu        sync.Mutex
	v         owner.View    // guarded by mu
	changed   chan struct{} // guarded by mu
	refreshes int           // guarded by mu: Refresh calls
}

// New returns Views holding v.
func New(v owner.View) *Views { return &Views{v: v, changed: make(chan struct{})} }

// View returns the view last set.
func (o *Views) View() owner.View {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.v
}

// Changed is closed at the next Set.
func (o *Views) Changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

// Refresh counts a request to read the record now; the view changes only
// by Set.
func (o *Views) Refresh() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refreshes++
}

// Refreshes returns how many times Refresh was called.
func (o *Views) Refreshes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.refreshes
}

// Set replaces the view and wakes Changed's waiters.
func (o *Views) Set(v owner.View) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.v = v
	close(o.changed)
	o.changed = make(chan struct{})
}
