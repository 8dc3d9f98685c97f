package watchhub

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// deafSource is a store whose change notification never comes: WaitRev
// returns only a head that had already passed when it was called, as a
// replica's hub waiting for a FoundationDB watch that has not fired yet.
// parked counts the waits that found nothing and block.
type deafSource struct {
	*gatedSource
	calls  atomic.Int64
	parked atomic.Int64
}

func (d *deafSource) WaitRev(ctx context.Context, after int64, wake <-chan struct{}) (int64, error) {
	d.calls.Add(1)
	rev, _, err := d.Rev(ctx)
	if err != nil || rev > after {
		return rev, err
	}
	d.parked.Add(1)
	select {
	case <-wake:
		return rev, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestServedRevisionWakesReplicaHub: on a replica (not SoleWriter) a
// revision the process put in a response header (Served: the owner's
// answer to a write it forwarded), or one the owner's commit feed reported
// (Committed), wakes the hub, which reads and delivers it without the
// store's notification; a rise the hub has already dispatched is nothing
// to wait for.
func TestServedRevisionWakesReplicaHub(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(*progress.Served) Config
	}{
		{"served", func(w *progress.Served) Config { return Config{Served: w} }},
		{"committed", func(w *progress.Served) Config { return Config{Committed: w} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			w := &progress.Served{}
			src := &deafSource{gatedSource: &gatedSource{Store: s}}
			h := newHub(t, src, tc.config(w))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			st := h.NewStream()
			defer st.Close()
			if err := st.Watch(ctx, Options{Key: []byte("k")}); err != nil {
				t.Fatal(err)
			}
			drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
			for i, v := range []string{"1", "2", "3"} {
				waitFor(t, func() bool { return src.parked.Load() > int64(i) })
				rev := putKey(t, s, "k", v)
				w.Observe(rev)
				drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
				if err := h.WaitCaughtUp(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFeedKeepsFollowerOffStoreNotification: once the owner's feed
// (Committed) told a follower's hub of a revision, the hub's next waits
// wait for the feed and do not ask the store to notify it (on
// FoundationDB a read of the head and a storage watch per revision) while
// the feed keeps coming; a commit the feed does not tell of is still
// delivered, FeedGrace later.
func TestFeedKeepsFollowerOffStoreNotification(t *testing.T) {
	setup := func(t *testing.T, grace time.Duration) (*mvcc.Store, *deafSource, *progress.Served, *Stream) {
		s := newStore(t)
		w := &progress.Served{}
		src := &deafSource{gatedSource: &gatedSource{Store: s}}
		h := newHub(t, src, Config{Committed: w, FeedGrace: grace})
		st := h.NewStream()
		t.Cleanup(st.Close)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := st.Watch(ctx, Options{Key: []byte("k")}); err != nil {
			t.Fatal(err)
		}
		drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
		waitFor(t, func() bool { return src.parked.Load() > 0 })
		rev := putKey(t, s, "k", "0")
		w.Observe(rev)
		drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
		return s, src, w, st
	}
	t.Run("fed", func(t *testing.T) {
		s, src, w, st := setup(t, time.Hour)
		calls := src.calls.Load()
		for i := range 5 {
			rev := putKey(t, s, "k", fmt.Sprint(i+1))
			w.Observe(rev)
			drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
		}
		if got := src.calls.Load(); got != calls {
			t.Fatalf("the hub asked the store for its next revision %d times while the feed told it of each", got-calls)
		}
	})
	t.Run("not fed", func(t *testing.T) {
		s, _, _, st := setup(t, 10*time.Millisecond)
		rev := putKey(t, s, "k", "1")
		drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
	})
}

// TestFollowerWaitsForTheFeedRatherThanStorage: on a follower whose feed
// from the owner is current, the owner's answer to a forwarded write
// (Served) can arrive before the feed's message of the same commit; the
// hub then waits for the feed and reads the revision from memory, not from
// storage, and its next wait waits for the feed again rather than for the
// store's change notification. The owner is another store on the same storage; the feed is
// played by hand: its revisions handed to the follower's store (Hold),
// then Committed raised, a few milliseconds after Served.
func TestFollowerWaitsForTheFeedRatherThanStorage(t *testing.T) {
	db := testdb.Open(t)
	open := func() *mvcc.Store {
		s, err := mvcc.Open(db, mvcc.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	owner, follower := open(), open()
	served, committed := &progress.Served{}, &progress.Served{}
	src := &deafSource{gatedSource: &gatedSource{Store: follower}}
	h := newHub(t, src, Config{Served: served, Committed: committed, FeedGrace: time.Second})
	feed := func(rev int64) {
		b, ok := owner.ReadTail(mvcc.WatchRead{From: rev, UpTo: rev, PrevKV: true})
		if !ok {
			t.Fatalf("the owner does not hold revision %d", rev)
		}
		follower.Hold(b.Revs, b.Compacted)
		committed.Observe(rev)
	}
	st := h.NewStream()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := st.Watch(ctx, Options{Key: []byte("k"), PrevKV: true}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
	rev := putKey(t, owner, "k", "0")
	feed(rev)
	drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
	before, calls := h.Stats().ReadsFromStorage, src.calls.Load()
	for i := range 5 {
		rev := putKey(t, owner, "k", fmt.Sprint(i+1))
		served.Observe(rev)
		time.Sleep(5 * time.Millisecond)
		feed(rev)
		drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.Rev == rev })
	}
	if n := h.Stats().ReadsFromStorage - before; n != 0 {
		t.Fatalf("the hub read %d of 5 revisions from storage that the feed brought", n)
	}
	if n := src.calls.Load() - calls; n != 0 {
		t.Fatalf("the hub asked the store for its next revision %d times while the feed told it of each", n)
	}
}
