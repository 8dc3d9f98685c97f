package tenant

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
)

// held is one slot of the router's scheduler a test holds for tenant, as
// a request of tenant's would while it runs.
type held struct {
	release func()
	granted chan struct{}
}

func hold(t *testing.T, e *env, tenant string) *held {
	h := &held{granted: make(chan struct{})}
	go func() {
		rel, err := e.router.sched.Acquire(context.Background(), tenant, 1)
		if err != nil {
			t.Error(err)
			rel = func() {}
		}
		h.release = rel
		close(h.granted)
	}()
	return h
}

// waitWaiting waits until n requests wait for a slot.
func waitWaiting(t *testing.T, e *env, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for e.router.sched.Stats().Waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting after a minute, want %d", e.router.sched.Stats().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFairDeadline: a put that waits for a slot past its deadline fails
// with it.
func TestFairDeadline(t *testing.T) {
	e := startRouter(t, false, func(c *Config) { c.Fair = fairsched.Config{Slots: 1, MaxWait: time.Minute} })
	e.create("noisy", "quiet")
	quiet := e.client("quiet")
	must(quiet.Put(ctxT(t), "k", "v"))(t)
	running := hold(t, e, "noisy")
	<-running.granted
	short, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	if _, err := quiet.Put(short, "k", "v"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a put while every slot is taken: %v, want its deadline", err)
	}
	running.release()
	must(quiet.Put(ctxT(t), "k", "v"))(t)
}

// TestFairTurns: once the process's slots are taken, a quiet tenant's put
// runs after one more of the noisy tenant's requests, ahead of the noisy
// tenant's others that came first.
func TestFairTurns(t *testing.T) {
	e := startRouter(t, false, func(c *Config) { c.Fair = fairsched.Config{Slots: 1, MaxWait: time.Minute} })
	e.create("noisy", "quiet")
	noisy, quiet := e.client("noisy"), e.client("quiet")
	must(noisy.Put(ctxT(t), "k", "v"))(t) // a tenant alone runs
	must(quiet.Put(ctxT(t), "k", "v"))(t)
	running := hold(t, e, "noisy")
	<-running.granted
	var noisyWaiting []*held
	for i := range 3 {
		noisyWaiting = append(noisyWaiting, hold(t, e, "noisy"))
		waitWaiting(t, e, i+1)
	}
	done := make(chan error, 1)
	go func() { _, err := quiet.Put(ctxT(t), "k", "v2"); done <- err }()
	waitWaiting(t, e, 4)
	running.release()
	<-noisyWaiting[0].granted // the noisy tenant's turn
	noisyWaiting[0].release()
	if err := <-done; err != nil { // then the quiet one's
		t.Fatalf("the quiet tenant's put: %v", err)
	}
	<-noisyWaiting[1].granted
	if st := e.router.sched.Stats(); st.Waiting != 1 || st.Running != 1 {
		t.Fatalf("after the quiet put: %+v, want the noisy tenant's last request waiting", st)
	}
	noisyWaiting[1].release()
	<-noisyWaiting[2].granted
	noisyWaiting[2].release()
}

// TestFairQueueBound: a tenant with its queue full gets etcd's too many
// requests at once; another tenant still queues.
func TestFairQueueBound(t *testing.T) {
	e := startRouter(t, false, func(c *Config) { c.Fair = fairsched.Config{Slots: 1, Queue: 1, MaxWait: time.Minute} })
	e.create("noisy", "quiet")
	noisy, quiet := e.client("noisy"), e.client("quiet")
	running := hold(t, e, "noisy")
	<-running.granted
	waiting := hold(t, e, "noisy")
	waitWaiting(t, e, 1)
	if _, err := noisy.Put(ctxT(t), "k", "v"); !errors.Is(err, rpctypes.ErrTooManyRequests) {
		t.Fatalf("a put past the tenant's queue: %v, want %v", err, rpctypes.ErrTooManyRequests)
	}
	done := make(chan error, 1)
	go func() { _, err := quiet.Put(ctxT(t), "k", "v"); done <- err }()
	waitWaiting(t, e, 2)
	running.release()
	<-waiting.granted
	waiting.release()
	if err := <-done; err != nil {
		t.Fatalf("the quiet tenant's put: %v", err)
	}
}

// TestFairHandBack: the slot a request takes travels in its context, so the
// write path can hand it back while the request waits for its commit
// (groupcommit); the interceptor's own release then gives back nothing
// more.
func TestFairHandBack(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1, MaxWait: 10 * time.Second})
	interceptor := turns{s: s, tenant: "noisy"}.unary()
	handler := func(ctx context.Context, _ any) (any, error) {
		fairsched.HandBack(ctx)
		release, err := s.Acquire(ctx, "quiet", 1)
		if err != nil {
			return nil, err
		}
		release()
		return nil, nil
	}
	if _, err := interceptor(context.Background(), nil, nil, handler); err != nil {
		t.Fatalf("another tenant's request after the hand-back: %v", err)
	}
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v after the request, want zero", st)
	}
}
