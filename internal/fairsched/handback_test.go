package fairsched_test

import (
	"context"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
)

// A slot handed back serves a waiter at once, and the holder's own release
// afterwards gives back nothing more: one slot, one give-back.
func TestHandBack(t *testing.T) {
	s := fairsched.New(fairsched.Config{Slots: 1})
	fairsched.HandBack(context.Background()) // holds nothing: a no-op
	ctx, release := fairsched.Hold(context.Background(), acquire(t, s, "noisy"))
	next := queued(t, s, "quiet", 1, 1)
	pending(t, next)
	fairsched.HandBack(ctx)
	r := get(t, next)
	fairsched.HandBack(ctx)
	release()
	if st := s.Stats(); st.Running != 1 || st.Waiting != 0 {
		t.Fatalf("after a hand-back and the holder's release: %+v, want the quiet request alone running", st)
	}
	third := queued(t, s, "noisy", 1, 1)
	pending(t, third)
	r.release()
	get(t, third).release()
	if st := s.Stats(); st != (fairsched.Stats{}) {
		t.Fatalf("stats %+v after every release, want zero", st)
	}
}
