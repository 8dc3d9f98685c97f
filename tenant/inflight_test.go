package tenant

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestInflightBound: once a tenant runs MaxInflight requests, its next
// one waits for a turn (and fails with its own deadline if none comes),
// while another tenant's requests run; a freed turn lets it through.
func TestInflightBound(t *testing.T) {
	const bound = 2
	e := startRouter(t, false, func(c *Config) { c.MaxInflight = bound })
	e.create("noisy", "quiet")
	noisy, quiet := e.client("noisy"), e.client("quiet")
	must(noisy.Put(ctxT(t), "k", "v"))(t)
	e.router.mu.Lock()
	inst := e.router.tenants["noisy"]
	e.router.mu.Unlock()
	for range bound { // every turn held, as by requests running
		if err := inst.inflight.acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	if _, err := noisy.Put(short, "k", "v"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a put beyond the tenant's turns: %v, want its deadline", err)
	}
	must(quiet.Put(ctxT(t), "k", "v"))(t)
	done := make(chan error, 1)
	go func() { _, err := noisy.Put(ctxT(t), "k", "v2"); done <- err }()
	inst.inflight.release()
	if err := <-done; err != nil {
		t.Fatalf("a put after a turn was freed: %v", err)
	}
	for range bound - 1 {
		inst.inflight.release()
	}
}
