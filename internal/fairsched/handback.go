package fairsched

import (
	"context"
	"sync"
)

// A slot is held for evaluation, which uses the CPU the slots share out. A
// request that then waits for I/O — its write's group commit, a read queued
// behind others — uses none, and holding the slot meanwhile would make
// other tenants wait for a disk sync or a FoundationDB commit instead of
// for CPU. So the slot travels in the request's context, and the code that
// starts such a wait hands it back (HandBack); the holder's own release
// then does nothing.

type heldKey struct{}

type held struct {
	once    sync.Once
	release func()
}

// Hold returns ctx carrying release, the give-back of the slot its work
// holds, and the function the holder calls when the work ends. release runs
// once, at the first of that call and a HandBack(ctx).
func Hold(ctx context.Context, release func()) (context.Context, func()) {
	h := &held{release: release}
	return context.WithValue(ctx, heldKey{}, h), h.give
}

// HandBack gives back the slot ctx's work holds, if it holds one (Hold) and
// has not given it back yet. The work goes on without a slot: what is left
// of it waits for I/O, not for CPU.
func HandBack(ctx context.Context) {
	if h, ok := ctx.Value(heldKey{}).(*held); ok {
		h.give()
	}
}

func (h *held) give() { h.once.Do(h.release) }
