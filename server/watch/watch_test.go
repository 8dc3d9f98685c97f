package watch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/server"
)

func TestStartRevisions(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	var revs []int64
	for i := range 5 {
		revs = append(revs, put(t, c, "k", fmt.Sprint(i)))
	}
	cur := revs[len(revs)-1]

	past := c.Watch(ctx, "k", clientv3.WithRev(revs[1]), clientv3.WithCreatedNotify())
	current := c.Watch(ctx, "k", clientv3.WithRev(cur))
	next := c.Watch(ctx, "k", clientv3.WithRev(cur+1))
	future := c.Watch(ctx, "k", clientv3.WithRev(cur+3))
	now := c.Watch(ctx, "k")

	created := <-past
	if !created.Created || created.Header.Revision != cur {
		t.Fatalf("created response %+v, want created at header revision %d", created, cur)
	}
	ev := collect(t, past, 4)
	for i, e := range ev {
		if e.Kv.ModRevision != revs[i+1] || string(e.Kv.Value) != fmt.Sprint(i+1) {
			t.Fatalf("past watch event %d: %v", i, e)
		}
	}
	if e := collect(t, current, 1); e[0].Kv.ModRevision != cur {
		t.Fatalf("watch at the current revision: %v", e[0])
	}
	// Revisions cur+1 .. cur+4.
	var more []int64
	for i := range 4 {
		more = append(more, put(t, c, "k", fmt.Sprint("more", i)))
	}
	for name, tc := range map[string]struct {
		ch   clientv3.WatchChan
		from int
	}{"next": {next, 0}, "future": {future, 2}, "now": {now, 0}} {
		ev := collect(t, tc.ch, len(more)-tc.from)
		for i, e := range ev {
			if e.Kv.ModRevision != more[tc.from+i] {
				t.Fatalf("%s watch event %d at revision %d, want %d", name, i, e.Kv.ModRevision, more[tc.from+i])
			}
		}
	}
}

func TestRangesFiltersPrevKV(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	base := rev(t, c)
	key := c.Watch(ctx, "a", clientv3.WithRev(base+1))
	prefix := c.Watch(ctx, "a/", clientv3.WithPrefix(), clientv3.WithRev(base+1), clientv3.WithPrevKV())
	rng := c.Watch(ctx, "a/b", clientv3.WithRange("a/d"), clientv3.WithRev(base+1))
	fromKey := c.Watch(ctx, "a/c", clientv3.WithFromKey(), clientv3.WithRev(base+1))
	noPut := c.Watch(ctx, "a/", clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(base+1), clientv3.WithPrevKV())
	noDel := c.Watch(ctx, "a/", clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(base+1))

	put(t, c, "a", "1")   // base+1
	put(t, c, "a/a", "1") // base+2
	put(t, c, "a/b", "1") // base+3
	put(t, c, "a/c", "1") // base+4
	put(t, c, "a/d", "1") // base+5
	put(t, c, "b", "1")   // base+6
	put(t, c, "a/b", "2") // base+7
	if _, err := c.Txn(ctx).Then(clientv3.OpPut("a/a", "2"), clientv3.OpDelete("a/c"), clientv3.OpPut("z", "1")).Commit(); err != nil {
		t.Fatal(err)
	} // base+8
	del(t, c, "a/", clientv3.WithPrefix()) // base+9: a/a a/b a/d

	str := func(evs []*clientv3.Event) string {
		var out []string
		for _, e := range evs {
			s := fmt.Sprintf("%s %s@%d", e.Type, e.Kv.Key, e.Kv.ModRevision-base)
			if e.PrevKv != nil {
				s += fmt.Sprintf(" prev=%s@%d", e.PrevKv.Value, e.PrevKv.ModRevision-base)
			}
			out = append(out, s)
		}
		return strings.Join(out, ", ")
	}
	for _, tc := range []struct {
		name string
		ch   clientv3.WatchChan
		want string
	}{
		{"key", key, "PUT a@1"},
		{"prefix", prefix, "PUT a/a@2, PUT a/b@3, PUT a/c@4, PUT a/d@5, PUT a/b@7 prev=1@3, PUT a/a@8 prev=1@2, DELETE a/c@8 prev=1@4, " +
			"DELETE a/a@9 prev=2@8, DELETE a/b@9 prev=2@7, DELETE a/d@9 prev=1@5"},
		{"range", rng, "PUT a/b@3, PUT a/c@4, PUT a/b@7, DELETE a/c@8, DELETE a/b@9"},
		{"from-key", fromKey, "PUT a/c@4, PUT a/d@5, PUT b@6, DELETE a/c@8, PUT z@8, DELETE a/d@9"},
		{"noput", noPut, "DELETE a/c@8 prev=1@4, DELETE a/a@9 prev=2@8, DELETE a/b@9 prev=2@7, DELETE a/d@9 prev=1@5"},
		{"nodelete", noDel, "PUT a/a@2, PUT a/b@3, PUT a/c@4, PUT a/d@5, PUT a/b@7, PUT a/a@8"},
	} {
		if got := str(collect(t, tc.ch, strings.Count(tc.want, ",")+1)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// Every event but a create carries PrevKv when asked, live and replayed
// (kube-apiserver rejects the event otherwise).
func TestPrevKVOnEveryNonCreateEvent(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	base := rev(t, c)
	live := c.Watch(ctx, "p/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	n := 0
	for i := range 50 {
		put(t, c, fmt.Sprintf("p/%d", i%7), fmt.Sprint(i))
		n++
		if i%5 == 4 {
			del(t, c, fmt.Sprintf("p/%d", i%7))
			n++
		}
	}
	replay := c.Watch(ctx, "p/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(base+1))
	for name, ch := range map[string]clientv3.WatchChan{"live": live, "replay": replay} {
		for _, e := range collect(t, ch, n) {
			if e.IsCreate() {
				if e.PrevKv != nil {
					t.Fatalf("%s: create event with PrevKv: %v", name, e)
				}
				continue
			}
			if e.PrevKv == nil || e.PrevKv.ModRevision >= e.Kv.ModRevision || !bytes.Equal(e.PrevKv.Key, e.Kv.Key) {
				t.Fatalf("%s: event without a proper PrevKv: %v", name, e)
			}
		}
	}
}

func TestWatchIDsCancelAndErrors(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	cur := rev(t, c)
	r := openRaw(t, c.ActiveConnection(), true)

	r.create(&pb.WatchCreateRequest{Key: []byte("x"), WatchId: 1})
	if id := r.created(); id != 1 {
		t.Fatalf("client-chosen id: got %d", id)
	}
	r.create(&pb.WatchCreateRequest{Key: []byte("x")})
	if id := r.created(); id != 0 {
		t.Fatalf("first automatic id: got %d, want 0", id)
	}
	r.create(&pb.WatchCreateRequest{Key: []byte("x")})
	if id := r.created(); id != 2 {
		t.Fatalf("automatic id after 0 and a client-chosen 1: got %d, want 2", id)
	}
	for _, tc := range []struct {
		req    *pb.WatchCreateRequest
		reason string
	}{
		{&pb.WatchCreateRequest{Key: []byte("x"), WatchId: 1}, "mvcc: duplicate watch ID provided on the WatchStream"},
		{&pb.WatchCreateRequest{Key: []byte("x"), StartRevision: -1}, rpctypes.ErrCompacted.Error()},
		{&pb.WatchCreateRequest{Key: []byte("z"), RangeEnd: []byte("a")}, "mvcc: watcher range is empty"},
	} {
		r.create(tc.req)
		resp := r.next(waitLong)
		if resp.WatchId != -1 || !resp.Created || !resp.Canceled || resp.CancelReason != tc.reason || resp.Header.Revision != cur {
			t.Fatalf("bad create %v: got %s", tc.req, respStr(resp))
		}
	}

	r.cancelWatch(0)
	resp := r.next(waitLong)
	if resp.WatchId != 0 || !resp.Canceled || resp.Created || resp.Header.Revision != cur {
		t.Fatalf("cancel: got %s", respStr(resp))
	}
	r.cancelWatch(0) // unknown now: no response
	r.cancelWatch(77)
	r.none(200 * time.Millisecond)

	w := put(t, c, "x", "1")
	got := map[int64]bool{}
	for range 2 {
		resp := r.next(waitLong)
		if len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != w || resp.Header.Revision != w {
			t.Fatalf("event: %s", respStr(resp))
		}
		got[resp.WatchId] = true
	}
	if !got[1] || !got[2] {
		t.Fatalf("events went to %v, want watchers 1 and 2", got)
	}
	r.none(200 * time.Millisecond)
}

func TestManyWatchersOnOneStream(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	r := openRaw(t, c.ActiveConnection(), true)
	const n = 300
	for i := range n {
		switch i % 3 {
		case 0:
			r.create(&pb.WatchCreateRequest{Key: []byte(fmt.Sprintf("m/%d", i%10))})
		case 1:
			r.create(&pb.WatchCreateRequest{Key: []byte("m/"), RangeEnd: []byte("m0")})
		case 2:
			r.create(&pb.WatchCreateRequest{Key: []byte(fmt.Sprintf("m/%d", i%10)), RangeEnd: []byte{0}})
		}
		if id := r.created(); id != int64(i) {
			t.Fatalf("watcher %d got id %d", i, id)
		}
	}
	var revs []int64
	for k := range 10 {
		revs = append(revs, put(t, c, fmt.Sprintf("m/%d", k), "v"))
	}
	want := map[int64][]int64{}
	for i := range n {
		for k := range 10 {
			var ok bool
			switch i % 3 {
			case 0:
				ok = k == i%10
			case 1:
				ok = true
			case 2:
				ok = k >= i%10
			}
			if ok {
				want[int64(i)] = append(want[int64(i)], revs[k])
			}
		}
	}
	got := map[int64][]int64{}
	total := 0
	for _, w := range want {
		total += len(w)
	}
	for seen := 0; seen < total; {
		resp := r.next(waitLong)
		for _, ev := range resp.Events {
			got[resp.WatchId] = append(got[resp.WatchId], ev.Kv.ModRevision)
			seen++
		}
	}
	for id, w := range want {
		if fmt.Sprint(got[id]) != fmt.Sprint(w) {
			t.Fatalf("watcher %d: got revisions %v, want %v", id, got[id], w)
		}
	}
	r.none(200 * time.Millisecond)
}

// A response larger than --max-request-bytes plus etcd's 512 KiB overhead is
// split into fragments, only for watchers that asked, the way etcd splits.
func TestFragment(t *testing.T) {
	const maxReq = 64 << 10
	s := start(t, server.Config{MaxRequestBytes: maxReq})
	c := s.Client
	base := rev(t, c)
	val := strings.Repeat("v", 40<<10)
	const n = 30 // 30 x 40 KiB = 1.2 MB, over 64 KiB + 512 KiB
	for i := range n {
		put(t, c, fmt.Sprintf("f/%02d", i), val)
	}
	limit := maxReq + 512<<10

	awaitReady(t, s) // the hub has dispatched the writes: the replay reads them from history
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0"), StartRevision: base + 1, Fragment: true})
	id := r.created()
	// The replay may come as one catch-up response plus live ones (if the
	// hub had not dispatched the last writes yet); the large one must come
	// in fragments.
	var evs []*mvccpb.Event
	frags := 0
	for len(evs) < n {
		resp := r.next(waitLong)
		if resp.WatchId != id {
			t.Fatalf("unexpected response %s", respStr(resp))
		}
		if resp.Fragment {
			frags++
		}
		// Every response but a single-event one stays under the limit.
		if len(resp.Events) > 1 {
			if sz := sizeOf(resp); sz >= limit {
				t.Fatalf("fragment of %d bytes, limit %d", sz, limit)
			}
		}
		evs = append(evs, resp.Events...)
	}
	if frags == 0 || len(evs) != n {
		t.Fatalf("got %d events with %d fragments, want %d events, fragmented", len(evs), frags, n)
	}
	for i, ev := range evs {
		if ev.Kv.ModRevision != base+1+int64(i) || len(ev.Kv.Value) != len(val) {
			t.Fatalf("fragmented event %d: rev %d", i, ev.Kv.ModRevision)
		}
	}

	// Without the option the same replay comes whole.
	r.create(&pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0"), StartRevision: base + 1})
	r.created()
	got := 0
	for got < n {
		resp := r.next(waitLong)
		if resp.Fragment {
			t.Fatalf("fragment for a watcher that did not ask: %s", respStr(resp))
		}
		got += len(resp.Events)
	}

	// clientv3 reassembles fragments.
	ctx := testCtx(t)
	ch := c.Watch(ctx, "f/", clientv3.WithPrefix(), clientv3.WithRev(base+1), clientv3.WithFragment())
	if got := collect(t, ch, n); len(got) != n {
		t.Fatalf("clientv3 got %d events", len(got))
	}
}

func TestCompactedStart(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	put(t, c, "c", "1")
	r2 := put(t, c, "c", "2")
	put(t, c, "c", "3")
	if _, err := c.Compact(ctx, r2); err != nil {
		t.Fatal(err)
	}
	ch := c.Watch(ctx, "c", clientv3.WithRev(r2-1))
	wr := <-ch
	if !errors.Is(wr.Err(), rpctypes.ErrCompacted) || wr.CompactRevision != r2 {
		t.Fatalf("watch below the compaction: %+v err %v", wr, wr.Err())
	}
	// At the compaction revision itself the history is still there.
	if e := collect(t, c.Watch(ctx, "c", clientv3.WithRev(r2)), 2); e[0].Kv.ModRevision != r2 {
		t.Fatalf("watch at the compaction revision: %v", e)
	}
	// The raw response: created, then canceled with compact_revision and a
	// zero header revision, as etcd sends it.
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("c"), StartRevision: 1})
	id := r.created()
	resp := r.next(waitLong)
	if resp.WatchId != id || !resp.Canceled || resp.CompactRevision != r2 || resp.Header.Revision != 0 || resp.Created {
		t.Fatalf("compacted response: %s", respStr(resp))
	}
}

// On Stop every stream ends with etcd's Unavailable "server stopped", which
// clientv3 retries (reconnecting elsewhere), and new streams are refused.
func TestStopEndsStreams(t *testing.T) {
	s := start(t, server.Config{ShutdownTimeout: 5 * time.Second})
	c := s.Client
	r := openRaw(t, c.ActiveConnection(), true)
	r.create(&pb.WatchCreateRequest{Key: []byte("s")})
	r.created()
	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case err := <-r.errc:
		st, _ := status.FromError(err)
		if st.Code() != codes.Unavailable || st.Message() != "etcdserver: server stopped" {
			t.Fatalf("stream ended with %v, want etcd's server stopped", err)
		}
	case <-time.After(waitLong):
		t.Fatal("stream not ended by Stop")
	}
	select {
	case <-done:
	case <-time.After(waitLong):
		t.Fatal("Stop did not return")
	}
	// New streams are refused the same way.
	nr, err := pb.NewWatchClient(c.ActiveConnection()).Watch(context.Background())
	if err == nil {
		_, err = nr.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("new stream after Stop: %v", err)
	}
}

func sizeOf(m *pb.WatchResponse) int { return proto.Size(m) }

// TestHubRunsOnlyWhileStreamsAreOpen: a server nobody watches follows no
// revision log (its hub starts with the first stream and stops with the
// last), a hub started again serves past revisions as the first did, and
// the service's counters do not go back when a hub stops.
func TestHubRunsOnlyWhileStreamsAreOpen(t *testing.T) {
	s := start(t, server.Config{})
	put(t, s.Client, "a", "1")
	awaitReady(t, s)
	if got := metric(t, s, "fdb_etcd_watch_hub_dispatched_revision"); got != 0 {
		t.Fatalf("with no stream open, the hub has dispatched revision %v", got)
	}
	var answered float64
	for round := range 2 {
		raw := openRaw(t, s.Client.ActiveConnection(), true)
		raw.create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b"), StartRevision: 1})
		raw.created()
		rv := put(t, s.Client, "a", fmt.Sprint(round+2))
		var seen []int64
		for len(seen) < round+2 {
			for _, ev := range raw.next(waitLong).Events {
				seen = append(seen, ev.Kv.ModRevision)
			}
		}
		if seen[len(seen)-1] != rv {
			t.Fatalf("round %d: events at %v, the last put at %d", round, seen, rv)
		}
		raw.requestProgress()
		if p := raw.next(waitLong); !isProgress(p) || p.Header.Revision < rv {
			t.Fatalf("round %d: progress answer %s", round, respStr(p))
		}
		if got := metric(t, s, "fdb_etcd_watch_hub_dispatched_revision"); got < float64(rv) {
			t.Fatalf("round %d: the hub dispatched %v with a stream open, the store at %d", round, got, rv)
		}
		now := metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "memory") +
			metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "read")
		if now < answered+1 {
			t.Fatalf("round %d: %v progress answers counted, %v before the round", round, now, answered)
		}
		answered = now
		raw.cancel()
		deadline := time.Now().Add(waitLong)
		for metric(t, s, "etcd_debugging_mvcc_watch_stream_total") != 0 || metric(t, s, "fdb_etcd_watch_hub_dispatched_revision") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the hub still runs after its last stream closed", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if now := metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "memory") +
			metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "read"); now != answered {
			t.Fatalf("round %d: progress answers went from %v to %v when the hub stopped", round, answered, now)
		}
	}
}
