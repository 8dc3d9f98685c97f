package watchhub

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

const wait = 20 * time.Second

// gate holds the reads that pass it while it is held.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil while open
}

func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ch = make(chan struct{})
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.ch)
	g.ch = nil
}

func (g *gate) pass(ctx context.Context) error {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gatedSource lets a test hold the hub's tail reads (no UpTo, values read)
// while catch-up reads and progress requests' log reads go through, and
// hold progress requests' reads of the head (keys only) on their own.
type gatedSource struct {
	*mvcc.Store
	gate                   // the hub's tail reads
	probeGate gate         // progress requests' reads of the head
	probes    atomic.Int64 // such reads started
	probed    atomic.Int64 // such reads done
}

func (g *gatedSource) holdProbes()    { g.probeGate.hold() }
func (g *gatedSource) releaseProbes() { g.probeGate.release() }

func (g *gatedSource) ReadWatchEvents(ctx context.Context, r mvcc.WatchRead) (mvcc.EventBatch, error) {
	if r.KeysOnly {
		g.probes.Add(1)
		defer g.probed.Add(1)
		if err := g.probeGate.pass(ctx); err != nil {
			return mvcc.EventBatch{}, err
		}
	}
	if r.UpTo == 0 && !r.KeysOnly {
		if err := g.gate.pass(ctx); err != nil {
			return mvcc.EventBatch{}, err
		}
	}
	return g.Store.ReadWatchEvents(ctx, r)
}

func newStore(t *testing.T) *mvcc.Store {
	t.Helper()
	s, err := mvcc.Open(testdb.Open(t), mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newHub(t *testing.T, src Source, cfg Config) *Hub {
	t.Helper()
	h, err := New(context.Background(), src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h
}

func putKey(t *testing.T, s *mvcc.Store, key, val string) int64 {
	t.Helper()
	r, err := s.Put(context.Background(), &pb.PutRequest{Key: []byte(key), Value: []byte(val)})
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// drain pops responses until stop says it has enough.
func drain(t *testing.T, st *Stream, stop func(r Response) bool) {
	t.Helper()
	deadline := time.After(wait)
	var buf []Response
	for {
		buf = st.Pop(buf[:0], 64)
		for _, r := range buf {
			if stop(r) {
				return
			}
		}
		if len(buf) == 0 {
			select {
			case <-st.Ready():
			case <-deadline:
				t.Fatal("timed out draining a stream")
			}
		}
	}
}

func TestIndexMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"", "a", "a/", "a/b", "a/b/c", "a0", "b", "b/x", "\xff", "\xff\xff", "c/d", "a/c"}
	randKey := func() []byte {
		k := keys[rng.IntN(len(keys))]
		if rng.IntN(3) == 0 {
			k += string(rune('a' + rng.IntN(3)))
		}
		return []byte(k)
	}
	ix := newIndex(true)
	var live []*Watcher
	for step := range 1500 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			ix.remove(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		} else {
			w := &Watcher{id: int64(step), key: randKey()}
			switch rng.IntN(4) {
			case 0: // single key
			case 1:
				if e := prefixEnd(w.key); e != nil {
					w.end = e
				}
			case 2:
				w.end = []byte{}
			case 3:
				w.end = append(randKey(), 'z')
			}
			ix.add(w)
			live = append(live, w)
		}
		if ix.size != len(live) {
			t.Fatalf("size %d, want %d", ix.size, len(live))
		}
		for range 5 {
			k := randKey()
			var got, want []int64
			for _, g := range ix.match(k, nil) {
				for _, w := range g.ws {
					got = append(got, w.id)
				}
			}
			for _, w := range live {
				if w.holds(k) {
					want = append(want, w.id)
				}
			}
			sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
			sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d key %q: matched %v, want %v", step, k, got, want)
			}
		}
	}
}

// One stream that is never drained must neither block the hub nor the
// other streams, must hold at most its bounded queue, and must get every
// event once it drains.
func TestSlowStreamIsolatedAndComplete(t *testing.T) {
	s := newStore(t)
	cfg := Config{StreamEntries: 16, StreamBytes: 32 << 10, CatchUpRevs: 20}
	h := newHub(t, s, cfg)
	ctx := context.Background()

	slow := h.NewStream()
	if err := slow.Watch(ctx, Options{Key: []byte("k/"), End: []byte("k0"), PrevKV: true}); err != nil {
		t.Fatal(err)
	}
	const streams, writes = 200, 400
	fast := make([]*Stream, streams)
	for i := range fast {
		fast[i] = h.NewStream()
		o := Options{Key: []byte("k/"), End: []byte("k0")}
		if i%2 == 1 {
			o = Options{Key: []byte(fmt.Sprintf("k/%d", i%10))}
		}
		if err := fast[i].Watch(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var all []int64
	keyOf := map[int64]int{}
	var wg sync.WaitGroup
	got := make([][]int64, streams)
	errs := make(chan error, streams)
	for i, st := range fast {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := writes
			if i%2 == 1 {
				want = writes / 10
			}
			deadline := time.After(wait)
			var buf []Response
			for len(got[i]) < want {
				buf = st.Pop(buf[:0], 64)
				for _, r := range buf {
					for _, e := range r.Events {
						got[i] = append(got[i], e.Rev())
					}
				}
				if len(buf) == 0 {
					select {
					case <-st.Ready():
					case <-deadline:
						errs <- fmt.Errorf("stream %d got %d of %d events", i, len(got[i]), want)
						return
					}
				}
			}
		}()
	}
	for i := range writes {
		rv := putKey(t, s, fmt.Sprintf("k/%d", i%10), "value")
		all = append(all, rv)
		keyOf[rv] = i % 10
		if n, b := slow.Len(); n > cfg.StreamEntries+1 || b > cfg.StreamBytes+1024 {
			t.Fatalf("slow stream holds %d responses, %d bytes", n, b)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range fast {
		var want []int64
		for _, rv := range all {
			if i%2 == 0 || keyOf[rv] == i%10 {
				want = append(want, rv)
			}
		}
		if fmt.Sprint(got[i]) != fmt.Sprint(want) {
			t.Fatalf("stream %d: events differ", i)
		}
	}
	if st := h.Stats(); st.Lagging != 1 {
		t.Fatalf("stats %+v, want the undrained watcher slow", st)
	}
	var slowGot []int64
	drain(t, slow, func(r Response) bool {
		for _, e := range r.Events {
			if e.PB.Kv.ModRevision != e.PB.Kv.CreateRevision && e.PB.PrevKv == nil {
				t.Fatalf("event without PrevKv: %v", e.PB)
			}
			slowGot = append(slowGot, e.Rev())
		}
		return len(slowGot) == writes
	})
	if fmt.Sprint(slowGot) != fmt.Sprint(all) {
		t.Fatal("slow stream's events differ from the history")
	}
	waitFor(t, func() bool { st := h.Stats(); return st.Lagging == 0 && st.Synced == streams+1 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// A progress request made while the hub is behind the store is answered
// once the hub catches up, with a revision no lower than the store's at the
// time of the request, after the events up to it.
func TestProgressWaitsForTheHub(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	h := newHub(t, g, Config{})
	ctx := context.Background()
	st := h.NewStream()
	if err := st.Watch(ctx, Options{Key: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
	g.hold()
	r1 := putKey(t, s, "p", "1")
	putKey(t, s, "other", "1")
	R := putKey(t, s, "other", "2")
	if err := st.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n, _ := st.Len(); n != 0 {
		t.Fatalf("%d responses queued while the hub is held", n)
	}
	g.release()
	var kinds []string
	drain(t, st, func(r Response) bool {
		switch r.Kind {
		case KindEvents:
			kinds = append(kinds, fmt.Sprintf("events@%d", r.Events[0].Rev()))
		case KindProgress:
			kinds = append(kinds, fmt.Sprintf("progress@%d/%d", r.Rev, r.WatchID))
			return true
		}
		return false
	})
	if want := fmt.Sprintf("[events@%d progress@%d/-1]", r1, R); fmt.Sprint(kinds) != want {
		t.Fatalf("got %v, want %s", kinds, want)
	}
}

// A progress request on a synced stream is answered at the store's
// revision while the hub has not yet read the revisions after its own,
// when none of them is for the stream: it does not wait for the hub. A
// write the stream watches, still undispatched, makes it wait (as in
// TestProgressWaitsForTheHub).
func TestProgressDoesNotWaitForUnrelatedRevisions(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	h := newHub(t, g, Config{})
	ctx := context.Background()
	st := h.NewStream()
	if err := st.Watch(ctx, Options{Key: []byte("quiet/"), End: []byte("quiet0"), PrevKV: true}); err != nil {
		t.Fatal(err)
	}
	if err := st.Watch(ctx, Options{Key: []byte("q"), NoPut: true}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated && r.WatchID == 1 })
	g.hold()
	putKey(t, s, "busy/1", "1")
	putKey(t, s, "q", "put, filtered")
	R := putKey(t, s, "busy/2", "2")
	if err := st.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	var got []Response
	got = st.Pop(got, 8)
	if len(got) != 1 || got[0].Kind != KindProgress || got[0].Rev != R || got[0].WatchID != InvalidWatchID {
		t.Fatalf("with the hub held at %d: %+v, want one progress at %d", h.Rev(), got, R)
	}
	// Periodic progress stays behind until the hub has caught up, so no
	// lower revision follows.
	st.WatcherProgress([]int64{0, 1})
	if n, _ := st.Len(); n != 0 {
		t.Fatalf("%d responses after a periodic tick with the hub behind", n)
	}
	g.release()
	waitFor(t, func() bool { return h.Rev() >= R })
	st.WatcherProgress([]int64{0})
	drain(t, st, func(r Response) bool {
		if r.Kind != KindProgress || r.Rev < R {
			t.Fatalf("after catching up: %+v", r)
		}
		return true
	})
}

// quietStream returns a stream with a synced watcher on the quiet/ range,
// its created response drained.
func quietStream(t *testing.T, h *Hub) *Stream {
	t.Helper()
	st := h.NewStream()
	if err := st.Watch(context.Background(), Options{Key: []byte("quiet/"), End: []byte("quiet0")}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
	return st
}

// progressRevs pops what a stream has queued and returns the revisions of
// its progress responses; it fails on anything else.
func progressRevs(t *testing.T, st *Stream) []int64 {
	t.Helper()
	var revs []int64
	for _, r := range st.Pop(nil, 64) {
		if r.Kind != KindProgress || r.WatchID != InvalidWatchID {
			t.Fatalf("unexpected response %+v", r)
		}
		revs = append(revs, r.Rev)
	}
	return revs
}

// On a store only this process writes, a progress request on a synced
// stream whose hub has dispatched every revision the process has put in a
// response header is answered at once, without reading the store: the
// answer kube-apiserver's consistent reads wait for after each Range.
func TestProgressFromMemory(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	served := &progress.Served{}
	h := newHub(t, g, Config{Served: served, SoleWriter: true})
	st := quietStream(t, h)
	R := putKey(t, s, "busy/1", "1")
	served.Observe(R)
	waitFor(t, func() bool { return h.Rev() >= R })
	if err := st.RequestProgress(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := progressRevs(t, st); fmt.Sprint(got) != fmt.Sprint([]int64{R}) {
		t.Fatalf("progress answers %v, want [%d]", got, R)
	}
	if n := g.probes.Load(); n != 0 {
		t.Fatalf("the answer read the store %d times, want 0", n)
	}
}

// A revision the process has told a client of but the hub has not
// dispatched yet keeps the answer from coming from memory: it carries at
// least that revision.
func TestProgressFromMemoryNotBelowServed(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	served := &progress.Served{}
	h := newHub(t, g, Config{Served: served, SoleWriter: true})
	st := quietStream(t, h)
	g.hold()
	defer g.release()
	R := putKey(t, s, "busy/1", "1")
	served.Observe(R)
	if err := st.RequestProgress(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := progressRevs(t, st); fmt.Sprint(got) != fmt.Sprint([]int64{R}) {
		t.Fatalf("with the hub held below %d: progress answers %v, want [%d]", R, got, R)
	}
}

// sharedStoreStream is a hub on a store other processes write (no
// SoleWriter), with a quiet stream, after one write the process told a
// client of (R0) and the hub dispatched.
func sharedStoreStream(t *testing.T) (*mvcc.Store, *gatedSource, *Hub, *Stream, int64) {
	t.Helper()
	s := newStore(t)
	g := &gatedSource{Store: s}
	served := &progress.Served{}
	h := newHub(t, g, Config{Served: served})
	st := quietStream(t, h)
	R0 := putKey(t, s, "busy/1", "1")
	served.Observe(R0)
	waitFor(t, func() bool { return h.Rev() >= R0 })
	return s, g, h, st, R0
}

// On a store other processes write too (replicas on FoundationDB), a
// revision another replica committed — and may have told a client of, as
// the Range of a kube-apiserver spreading its requests over replicas does
// — gets a second notification at the store's head after the answer from
// memory, without waiting for the hub; with no newer head, one answer.
func TestProgressFromMemoryThenHeadOnSharedStore(t *testing.T) {
	s, g, h, st, R0 := sharedStoreStream(t)
	ctx := context.Background()
	if err := st.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return g.probed.Load() == 1 })
	h.Rev() // the head check answers under the hub's lock, after its read
	if got := progressRevs(t, st); fmt.Sprint(got) != fmt.Sprint([]int64{R0}) {
		t.Fatalf("nothing newer committed: progress answers %v, want [%d]", got, R0)
	}
	g.hold()
	defer g.release()
	putKey(t, s, "busy/2", "2") // committed by this store: in its log's tail
	// Committed by "another replica": not in served, nor in this store's
	// tail, whose read would report busy/2's revision as its head.
	other, err := mvcc.Open(s.DB(), mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	R := putKey(t, other, "busy/3", "3")
	if err := st.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	var got []int64
	drain(t, st, func(r Response) bool {
		got = append(got, r.Rev)
		return r.Rev >= R
	})
	if fmt.Sprint(got) != fmt.Sprint([]int64{R0, R}) {
		t.Fatalf("with the hub held at %d and the head at %d: progress answers %v, want [%d %d]", R0, R, got, R0, R)
	}
}

// The read of the head that follows answers from memory on a shared store
// runs off the stream's receive path: while it waits, further requests are
// answered from memory at once, and they share one more read, started
// after they arrived, whose newer head gets one more notification.
func TestProgressHeadCheckDoesNotBlockRequests(t *testing.T) {
	s, g, h, st, R0 := sharedStoreStream(t)
	ctx := context.Background()
	g.holdProbes()
	for range 3 {
		done := make(chan error, 1)
		go func() { done <- st.RequestProgress(ctx) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(wait):
			t.Fatal("a progress request waited for the head check of an earlier one")
		}
	}
	if got := progressRevs(t, st); fmt.Sprint(got) != fmt.Sprint([]int64{R0, R0, R0}) {
		t.Fatalf("answers from memory %v, want three at %d", got, R0)
	}
	g.hold()
	defer g.release()
	R := putKey(t, s, "busy/2", "2") // committed by another process
	g.releaseProbes()
	var got []int64
	drain(t, st, func(r Response) bool {
		got = append(got, r.Rev)
		return r.Rev >= R
	})
	waitFor(t, func() bool { return g.probed.Load() == 2 })
	h.Rev()
	got = append(got, progressRevs(t, st)...)
	if fmt.Sprint(got) != fmt.Sprint([]int64{R}) || g.probes.Load() != 2 {
		t.Fatalf("after the head checks: answers %v and %d reads, want one answer at %d and 2 reads", got, g.probes.Load(), R)
	}
}

// The hub falling behind a whole compaction cancels the synced watchers
// that needed a compacted revision, as etcd cancels an unsynced watcher,
// and keeps the others.
func TestHubBehindCompaction(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	h := newHub(t, g, Config{})
	ctx := context.Background()
	st := h.NewStream()
	if err := st.Watch(ctx, Options{Key: []byte("a")}); err != nil { // id 0, from now
		t.Fatal(err)
	}
	g.hold()
	putKey(t, s, "a", "1")
	r2 := putKey(t, s, "a", "2")
	if err := st.Watch(ctx, Options{Key: []byte("a"), StartRev: r2 + 5}); err != nil { // id 1, future
		t.Fatal(err)
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: r2}); err != nil {
		t.Fatal(err)
	}
	g.release()
	var got []string
	drain(t, st, func(r Response) bool {
		if r.Kind == KindCompacted {
			got = append(got, fmt.Sprintf("compacted %d at %d", r.WatchID, r.CompactRev))
		}
		return r.Kind == KindCompacted
	})
	if fmt.Sprint(got) != fmt.Sprintf("[compacted 0 at %d]", r2) {
		t.Fatalf("got %v", got)
	}
	// Watcher 1 is still live.
	for range 5 {
		putKey(t, s, "a", "x")
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindEvents && r.WatchID == 1 })
}

// Stop ends every goroutine the hub started, including catch-ups blocked on
// a full stream.
func TestStopEndsGoroutines(t *testing.T) {
	s := newStore(t)
	before := runtime.NumGoroutine()
	h, err := New(context.Background(), s, Config{StreamEntries: 2, CatchUpRevs: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var streams []*Stream
	for i := range 5 {
		st := h.NewStream()
		streams = append(streams, st)
		if err := st.Watch(ctx, Options{Key: []byte("g"), StartRev: 1}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			for range 20 {
				putKey(t, s, "g", "v")
			}
		}
	}
	waitFor(t, func() bool { return h.Stats().Lagging+h.Stats().Unsynced > 0 })
	h.Stop()
	for _, st := range streams {
		st.Close()
	}
	deadline := time.Now().Add(wait)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A newer head that a progress request's read of the store found ends the
// hub's wait for the store's change notification: the answer that waits
// for the hub to dispatch a revision the stream watches comes once the hub
// has read it, not when the notification of another process's commit
// finally arrives.
func TestProgressHeadReadWakesTheHub(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	served := &progress.Served{}
	src := &deafSource{gatedSource: g}
	h := newHub(t, src, Config{Served: served})
	ctx := context.Background()
	st := h.NewStream()
	if err := st.Watch(ctx, Options{Key: []byte("busy/"), End: []byte("busy0")}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
	waitFor(t, func() bool { return src.parked.Load() > 0 })
	R := putKey(t, s, "busy/1", "1") // committed by another process
	if err := st.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	drain(t, st, func(r Response) bool {
		switch r.Kind {
		case KindEvents:
			got = append(got, fmt.Sprintf("events@%d", r.Events[0].Rev()))
		case KindProgress:
			got = append(got, fmt.Sprintf("progress@%d", r.Rev))
		}
		return r.Kind == KindProgress && r.Rev >= R
	})
	if want := fmt.Sprintf("[progress@%d events@%d progress@%d]", R-1, R, R); fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}

// A progress request that finds the hub behind a revision the process has
// told a client of (Served) sets the hub reading it at once, while the
// request's own read of the head is still under way.
func TestProgressBehindServedWakesTheHub(t *testing.T) {
	s := newStore(t)
	g := &gatedSource{Store: s}
	served := &progress.Served{}
	src := &deafSource{gatedSource: g}
	h := newHub(t, src, Config{Served: served})
	ctx := context.Background()
	st := h.NewStream()
	if err := st.Watch(ctx, Options{Key: []byte("busy/"), End: []byte("busy0")}); err != nil {
		t.Fatal(err)
	}
	drain(t, st, func(r Response) bool { return r.Kind == KindCreated })
	waitFor(t, func() bool { return src.parked.Load() > 0 })
	R := putKey(t, s, "busy/1", "1")
	served.Observe(R)
	g.holdProbes()
	done := make(chan error, 1)
	go func() { done <- st.RequestProgress(ctx) }()
	drain(t, st, func(r Response) bool {
		if r.Kind != KindEvents || r.Events[0].Rev() != R {
			t.Fatalf("with the head read held: %+v, want the events of %d", r, R)
		}
		return true
	})
	g.releaseProbes()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
