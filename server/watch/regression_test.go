package watch_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/watch"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
	"github.com/fdb-etcd/fdb-etcd/watchhub"
)

// etcd #15220: a requested progress notification must not overtake events.
// While a writer runs, the client keeps requesting progress on a stream with
// live, replaying and slow watchers; whenever a progress notification with
// revision R arrives, every event <= R of every watcher must have arrived
// before it, and none after.
func TestEtcd15220ProgressNeverOvertakesEvents(t *testing.T) {
	s := start(t, server.Config{Watch: smallQueues()})
	c := s.Client
	base := rev(t, c)
	r := openRaw(t, c.ActiveConnection(), true)
	// Watchers: live on a prefix, live on one key, replaying from base+1 (they
	// start once some history exists).
	r.create(&pb.WatchCreateRequest{Key: []byte("e/"), RangeEnd: []byte("e0"), PrevKv: true})
	r.created()
	r.create(&pb.WatchCreateRequest{Key: []byte("e/3")})
	r.created()

	const writes = 600
	revs := make(chan int64, writes)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range writes {
			revs <- put(t, c, fmt.Sprintf("e/%d", i%10), strings.Repeat("x", 500))
		}
		close(revs)
	}()
	// Progress requests and late replaying watchers while the writer runs.
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			r.requestProgress()
			if i%50 == 25 {
				r.create(&pb.WatchCreateRequest{Key: []byte("e/"), RangeEnd: []byte("e0"), StartRevision: base + 1})
			}
		}
	}()

	var all []int64
	for rv := range revs {
		all = append(all, rv)
	}
	close(stop)
	wg.Wait()
	last := all[len(all)-1]
	r.requestProgress()

	// Expected revisions: watcher 1 watches e/3 only; the others the prefix.
	var prefixRevs, keyRevs []int64
	for i, rv := range all {
		prefixRevs = append(prefixRevs, rv)
		if i%10 == 3 {
			keyRevs = append(keyRevs, rv)
		}
	}
	expected := func(id int64) []int64 {
		if id == 1 {
			return keyRevs
		}
		return prefixRevs
	}
	upTo := func(exp []int64, R int64) int { return sort.Search(len(exp), func(i int) bool { return exp[i] > R }) }
	got := map[int64]int{0: 0, 1: 0} // events received per watcher, checked in order on arrival
	progressSeen := 0
	for {
		resp := r.next(waitLong)
		switch {
		case resp.Created:
			got[resp.WatchId] = 0
		case isProgress(resp) && resp.WatchId == -1:
			progressSeen++
			R := resp.Header.Revision
			for id, n := range got {
				if want := upTo(expected(id), R); n != want {
					t.Fatalf("progress at %d: watcher %d has %d events, want exactly the %d events <= %d", R, id, n, want, R)
				}
			}
			if R >= last {
				if progressSeen < 2 {
					t.Fatalf("only %d progress notifications answered", progressSeen)
				}
				return
			}
		default:
			exp := expected(resp.WatchId)
			for _, ev := range resp.Events {
				n := got[resp.WatchId]
				if n >= len(exp) || ev.Kv.ModRevision != exp[n] {
					t.Fatalf("watcher %d: event %d at revision %d, want %v", resp.WatchId, n, ev.Kv.ModRevision, exp[n:min(n+1, len(exp))])
				}
				got[resp.WatchId] = n + 1
			}
		}
	}
}

// etcd #17507: a progress request on a stream whose only watcher is new and
// has no events (it starts at the current revision, on a quiet key) is
// answered, once, without the client having to retry.
func TestEtcd17507ProgressForNewWatchWithoutEvents(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	R := put(t, c, "bar", "1")
	wch := c.Watch(ctx, "foo", clientv3.WithRev(R))
	if err := c.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if !wr.IsProgressNotify() || wr.Header.Revision != R {
			t.Fatalf("got %+v, want a progress notification at %d", wr, R)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("progress request not answered")
	}
	// Also on the raw protocol, for a watcher that must replay history first.
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("foo"), StartRevision: 1})
	r.created()
	r.requestProgress()
	resp := r.next(5 * time.Second)
	if !isProgress(resp) || resp.WatchId != -1 || resp.Header.Revision != R {
		t.Fatalf("got %s, want progress at %d", respStr(resp), R)
	}
	r.none(200 * time.Millisecond)
}

// etcd #17529: with many watchers multiplexed on one stream that the client
// does not read (starvation) and a compaction meanwhile, a watcher either
// gets every event in order or is canceled with compact_revision set —
// never a silent gap.
func TestEtcd17529NoEventsLostUnderStarvation(t *testing.T) {
	cfg := server.Config{Watch: smallQueues()}
	s := start(t, cfg)
	c := s.Client
	base := rev(t, c)
	conn := slowConn(t, s)
	r := openRaw(t, conn, false)
	const early, late = 100, 20
	for i := range early {
		r.create(&pb.WatchCreateRequest{Key: []byte("s/"), RangeEnd: []byte("s0"), PrevKv: true, StartRevision: base + 1 + int64(i%3)})
	}
	// Writes while nobody reads the stream, then a compaction past the
	// starved watchers, then watchers replaying from the compaction revision
	// on the same starved stream, then more writes.
	var all []int64
	for i := range 400 {
		all = append(all, put(t, c, fmt.Sprintf("s/%d", i%20), strings.Repeat("y", 200)))
	}
	ctx := testCtx(t)
	compactAt := all[len(all)*3/4]
	if _, err := c.Compact(ctx, compactAt, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	starts := map[int64]int64{}
	for i := range early {
		starts[int64(i)] = base + 1 + int64(i%3)
	}
	for i := range late {
		r.create(&pb.WatchCreateRequest{Key: []byte("s/"), RangeEnd: []byte("s0"), PrevKv: true, StartRevision: compactAt})
		starts[int64(early+i)] = compactAt
	}
	for i := range 100 {
		all = append(all, put(t, c, fmt.Sprintf("s/%d", i%20), strings.Repeat("y", 200)))
	}
	// Starved watchers are not synced: they are lagging, catching up, or
	// canceled for the compaction with the cancellation still queued.
	if synced := metric(t, s, "fdb_etcd_watchers", "state", "synced"); synced >= early+late {
		t.Fatalf("expected starved watchers while the stream is not read: %v of %d synced", synced, early+late)
	}
	final := put(t, c, "s/last", "z")
	all = append(all, final)

	r.startReading()
	got := map[int64][]int64{}
	compacted := map[int64]int64{}
	created := 0
	for done := 0; done < early+late; {
		resp := r.next(waitLong)
		switch {
		case resp.Created:
			created++
		case resp.CompactRevision != 0:
			compacted[resp.WatchId] = resp.CompactRevision
			done++
		default:
			for _, ev := range resp.Events {
				if !strings.HasPrefix(string(ev.Kv.Key), "s/") {
					t.Fatalf("stray event %s", evStr(ev))
				}
				if ev.Kv.ModRevision > compactAt && ev.Kv.CreateRevision != ev.Kv.ModRevision && ev.PrevKv == nil {
					t.Fatalf("event without PrevKv: %s", evStr(ev))
				}
				got[resp.WatchId] = append(got[resp.WatchId], ev.Kv.ModRevision)
				if ev.Kv.ModRevision == final {
					done++
				}
			}
		}
	}
	if created != early+late {
		t.Fatalf("%d created responses", created)
	}
	for id, startRev := range starts {
		var exp []int64
		for _, rv := range all {
			if rv >= startRev {
				exp = append(exp, rv)
			}
		}
		g := got[id]
		if len(g) > len(exp) || fmt.Sprint(g) != fmt.Sprint(exp[:len(g)]) {
			t.Fatalf("watcher %d: events are not a prefix of the history (got %d events)", id, len(g))
		}
		if c, ok := compacted[id]; ok {
			if c != compactAt || (len(g) > 0 && g[len(g)-1] >= c) {
				t.Fatalf("watcher %d canceled at compaction %d after an event at %v", id, c, g)
			}
			continue
		}
		if len(g) != len(exp) {
			t.Fatalf("watcher %d: %d of %d events and no compaction notice", id, len(g), len(exp))
		}
	}
	for i := range late {
		if _, ok := compacted[int64(early+i)]; ok {
			t.Fatalf("watcher %d starting at the compaction revision was canceled", early+i)
		}
	}
	t.Logf("%d of %d watchers were canceled by the compaction", len(compacted), early+late)
}

// etcd #18089: a watch starting at the compaction revision still gets the
// DELETE at that revision (the tombstone is kept), followed by later events.
func TestEtcd18089DeleteAtCompactionRevision(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	put(t, c, "k", "v2")
	put(t, c, "k", "v3")
	put(t, c, "k", "v4")
	r5 := del(t, c, "k")
	r6 := put(t, c, "k", "v6")
	if _, err := c.Compact(ctx, r5, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]clientv3.OpOption{{clientv3.WithRev(r5)}, {clientv3.WithRev(r5), clientv3.WithPrevKV()}} {
		ev := collect(t, c.Watch(ctx, "k", opts...), 2)
		if ev[0].Type != clientv3.EventTypeDelete || ev[0].Kv.ModRevision != r5 {
			t.Fatalf("first event %v, want the DELETE at %d", ev[0], r5)
		}
		// etcd reads prev_kv at r5-1, which is compacted: no PrevKv.
		if ev[0].PrevKv != nil {
			t.Fatalf("DELETE at the compaction revision carries PrevKv %v", ev[0].PrevKv)
		}
		if ev[1].Type != clientv3.EventTypePut || ev[1].Kv.ModRevision != r6 || string(ev[1].Kv.Value) != "v6" {
			t.Fatalf("second event %v", ev[1])
		}
	}
}

// etcd #19179: a delete that is a key's last change, compacted at its own
// revision, must still be watchable from that revision after a restart.
func TestEtcd19179DeleteAtCompactionSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() *testserver.Server {
		db, err := pebble.Open(dir, pebble.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return testserver.Start(t, testserver.Options{DB: db})
	}
	s := open()
	c := s.Client
	ctx := testCtx(t)
	for _, k := range []string{"a", "b", "c", "d"} {
		put(t, c, k, "1")
	}
	r6 := del(t, c, "a")
	if _, err := c.Compact(ctx, r6, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	s.Stop()

	s = open()
	c = s.Client
	ev := collect(t, c.Watch(ctx, "a", clientv3.WithRev(r6)), 1)
	if ev[0].Type != clientv3.EventTypeDelete || ev[0].Kv.ModRevision != r6 {
		t.Fatalf("after restart: %v, want the DELETE at %d", ev[0], r6)
	}
	ev = collect(t, c.Watch(ctx, "", clientv3.WithFromKey(), clientv3.WithRev(r6)), 1)
	if ev[0].Type != clientv3.EventTypeDelete || string(ev[0].Kv.Key) != "a" {
		t.Fatalf("from-key watch after restart: %v", ev[0])
	}
	// A later compaction drops the tombstone; the key stays deleted.
	r7 := put(t, c, "b", "2")
	if _, err := c.Compact(ctx, r7, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if g, err := c.Get(ctx, "a"); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("deleted key after compaction: %v %v", g, err)
	}
}

// etcd #20221: a watcher that starts at a future revision gets no progress
// notification below its start revision, periodic or requested; once the
// store reaches it, it does.
func TestEtcd20221FutureWatchNoProgressBelowStart(t *testing.T) {
	cfg := server.Config{}
	cfg.Watch.ProgressNotifyInterval = 200 * time.Millisecond
	s := start(t, cfg)
	c := s.Client
	cur := rev(t, c)
	startRev := cur + 3
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("future"), StartRevision: startRev, ProgressNotify: true})
	r.created()
	check := func(d time.Duration) (progress []int64) {
		deadline := time.After(d)
		for {
			select {
			case resp := <-r.ch:
				if len(resp.Events) > 0 {
					t.Fatalf("unexpected events: %s", respStr(resp))
				}
				if isProgress(resp) {
					if resp.Header.Revision < startRev {
						t.Fatalf("progress notification at %d below the start revision %d", resp.Header.Revision, startRev)
					}
					progress = append(progress, resp.Header.Revision)
				}
			case <-deadline:
				return progress
			}
		}
	}
	r.requestProgress()
	check(700 * time.Millisecond)
	put(t, c, "other", "1") // cur+1
	r.requestProgress()
	check(700 * time.Millisecond)
	put(t, c, "other", "2") // cur+2
	put(t, c, "other", "3") // cur+3 = startRev
	p := check(900 * time.Millisecond)
	if len(p) == 0 {
		t.Fatal("no periodic progress once the store reached the start revision")
	}
	r.requestProgress()
	if p := check(500 * time.Millisecond); len(p) == 0 || p[len(p)-1] != startRev {
		t.Fatalf("requested progress after the start revision: %v", p)
	}
}

// Periodic progress with etcd's rules: each progress_notify watcher under its
// own id, every interval, skipped for a watcher that got events since the
// previous tick; not for watchers without the option.
func TestPeriodicProgress(t *testing.T) {
	clock := newTestClock()
	cfg := server.Config{}
	cfg.Watch.ProgressNotifyInterval = time.Second
	cfg.Watch.Clock = clock
	cfg.Watch.Jitter = func(int64) int64 { return 0 }
	s := start(t, cfg)
	c := s.Client
	cur := rev(t, c)
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("p1"), ProgressNotify: true})
	r.created()
	r.create(&pb.WatchCreateRequest{Key: []byte("p2"), ProgressNotify: true})
	r.created()
	r.create(&pb.WatchCreateRequest{Key: []byte("p3")})
	r.created()
	clock.AwaitTickers(t, 1)

	ids := func() map[int64]int64 {
		t.Helper()
		clock.Advance(time.Second)
		out := map[int64]int64{}
		deadline := time.After(500 * time.Millisecond)
		for {
			select {
			case resp := <-r.ch:
				if len(resp.Events) > 0 {
					continue
				}
				if !isProgress(resp) {
					t.Fatalf("unexpected %s", respStr(resp))
				}
				out[resp.WatchId] = resp.Header.Revision
			case <-deadline:
				return out
			}
		}
	}
	if got := ids(); fmt.Sprint(got) != fmt.Sprint(map[int64]int64{0: cur, 1: cur}) {
		t.Fatalf("first tick: %v", got)
	}
	w := put(t, c, "p1", "x")
	if resp := r.next(waitLong); resp.WatchId != 0 || len(resp.Events) != 1 {
		t.Fatalf("want the event for watcher 0, got %s", respStr(resp))
	}
	if got := ids(); fmt.Sprint(got) != fmt.Sprint(map[int64]int64{1: w}) {
		t.Fatalf("tick after an event for watcher 0: %v", got)
	}
	if got := ids(); fmt.Sprint(got) != fmt.Sprint(map[int64]int64{0: w, 1: w}) {
		t.Fatalf("next tick: %v", got)
	}
	r.cancelWatch(1)
	r.next(waitLong)
	if got := ids(); fmt.Sprint(got) != fmt.Sprint(map[int64]int64{0: w}) {
		t.Fatalf("tick after canceling watcher 1: %v", got)
	}
}

// A slow consumer: one stream that does not read while hundreds of watchers
// on other streams do. The others get everything promptly, the slow stream's
// memory stays within its bounds, and once it reads it gets every event, in
// order, once.
func TestSlowConsumer(t *testing.T) {
	wc := smallQueues()
	s := start(t, server.Config{Watch: wc})
	c := s.Client
	ctx := testCtx(t)
	base := rev(t, c)

	slow := openRaw(t, slowConn(t, s), false)
	slow.create(&pb.WatchCreateRequest{Key: []byte("w/"), RangeEnd: []byte("w0")})

	const streams, perStream = 10, 30 // 300 reading watchers
	type fast struct {
		ch   clientv3.WatchChan
		keys int
	}
	var fasts []fast
	for i := range streams {
		// clientv3 puts watches with different metadata on different streams.
		sctx := metadata.AppendToOutgoingContext(ctx, "test-stream", fmt.Sprint(i))
		for j := range perStream {
			if j%10 == 0 {
				fasts = append(fasts, fast{c.Watch(sctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(base+1)), -1})
			} else {
				fasts = append(fasts, fast{c.Watch(sctx, fmt.Sprintf("w/%d", j%10), clientv3.WithRev(base+1)), j % 10})
			}
		}
	}
	const writes = 1000
	val := strings.Repeat("v", 1024)
	var all []int64
	for i := range writes {
		all = append(all, put(t, c, fmt.Sprintf("w/%d", i%10), val))
	}
	start := time.Now()
	for i, f := range fasts {
		n := writes
		if f.keys >= 0 {
			n = writes / 10
		}
		ev := collect(t, f.ch, n)
		for j, e := range ev {
			want := all[j]
			if f.keys >= 0 {
				want = all[j*10+f.keys]
			}
			if e.Kv.ModRevision != want {
				t.Fatalf("fast watcher %d: event %d at %d, want %d", i, j, e.Kv.ModRevision, want)
			}
		}
	}
	t.Logf("%d reading watchers got all %d writes %v after the last write", len(fasts), writes, time.Since(start))

	if slowWatchers := metric(t, s, "etcd_debugging_mvcc_slow_watcher_total"); slowWatchers == 0 {
		t.Fatal("the non-reading stream's watcher is not catching up")
	}
	// Memory: what is queued is within the bounds (one oversized response
	// at most on top).
	queued := metric(t, s, "fdb_etcd_watch_queued_bytes")
	if queued == 0 || queued > float64(wc.Hub.StreamBytes+len(val)*2+1024) {
		t.Fatalf("queued %v bytes on the stalled stream, bound %d", queued, wc.Hub.StreamBytes)
	}
	t.Logf("%v bytes queued while the slow stream is stalled", queued)

	slow.startReading()
	if id := slow.created(); id != 0 {
		t.Fatalf("slow watcher id %d", id)
	}
	var got []int64
	for len(got) < writes {
		resp := slow.next(waitLong)
		for _, ev := range resp.Events {
			got = append(got, ev.Kv.ModRevision)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(all) {
		t.Fatal("the slow watcher's events differ from the history")
	}
	slow.none(200 * time.Millisecond)
	if slowWatchers := metric(t, s, "etcd_debugging_mvcc_slow_watcher_total"); slowWatchers != 0 {
		t.Fatalf("after draining, %v watchers still catching up", slowWatchers)
	}
}

type watchConfig = watch.Config

// smallQueues makes stream queues small, so that slowness shows quickly.
func smallQueues() (wc watchConfig) {
	wc.Hub = watchhub.Config{StreamEntries: 32, StreamBytes: 128 << 10, CatchUpRevs: 50}
	return wc
}

// slowConn dials the server with a fixed, small flow-control window (no
// BDP growth), so a stream that is not read blocks the server's sends soon.
func slowConn(t *testing.T, s *testserver.Server) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(s.Addr, "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func newTestClock() *fakeclock.Clock { return fakeclock.New(time.Unix(1_700_000_000, 0)) }
