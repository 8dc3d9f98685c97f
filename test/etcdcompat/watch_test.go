package etcdcompat

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Watch sequences. The same scripted steps (KV writes and watch stream
// requests) run against both servers; after each step the responses that
// arrived on each stream are rendered into a transcript grouped by watch ID
// and compared. Event batching into responses is timing dependent, so events
// are flattened per watch ID and the header revision of event-carrying
// responses is ignored; created / canceled / compacted / progress responses
// are compared in full (watch_id, flags, compact_revision, cancel_reason and
// header revision).

const (
	watchQuiet = 200 * time.Millisecond // a step is over after this long without responses
	watchMax   = 5 * time.Second
)

type watchStream struct {
	name   string
	stream pb.Watch_WatchClient
	cancel context.CancelFunc
	ch     chan *pb.WatchResponse
	errc   chan error
	dead   error
}

func openWatch(s *server) *watchStream {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchStream{name: s.name, cancel: cancel, ch: make(chan *pb.WatchResponse, 1024), errc: make(chan error, 1)}
	st, err := s.watch.Watch(ctx)
	if err != nil {
		w.dead = err
		return w
	}
	w.stream = st
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				w.errc <- err
				return
			}
			w.ch <- r
		}
	}()
	return w
}

func (w *watchStream) close() { w.cancel() }

func (w *watchStream) send(req *pb.WatchRequest) {
	if w.dead != nil {
		return
	}
	if err := w.stream.Send(req); err != nil {
		w.dead = err
	}
}

// collect gathers responses until none arrived for watchQuiet.
func (w *watchStream) collect() (resps []*pb.WatchResponse, streamErr error) {
	deadline := time.After(watchMax)
	quiet := time.NewTimer(watchQuiet)
	defer quiet.Stop()
	for {
		select {
		case r := <-w.ch:
			resps = append(resps, r)
			quiet.Reset(watchQuiet)
		case err := <-w.errc:
			w.dead = err
			return resps, err
		case <-quiet.C:
			return resps, w.dead
		case <-deadline:
			return resps, w.dead
		}
	}
}

// collectAtLeast goes on collecting after have until n items (see items)
// arrived, then until none arrived for watchQuiet, up to watchMax.
func (w *watchStream) collectAtLeast(have []*pb.WatchResponse, n int) ([]*pb.WatchResponse, error) {
	deadline := time.After(watchMax)
	for items(have) < n {
		select {
		case r := <-w.ch:
			have = append(have, r)
		case err := <-w.errc:
			w.dead = err
			return have, err
		case <-deadline:
			return have, w.dead
		}
	}
	more, err := w.collect()
	return append(have, more...), err
}

// items counts what a transcript compares: each event, and each response
// without events. How events are batched into responses is the server's
// choice, so two streams that delivered the same have the same items, not
// necessarily the same responses.
func items(resps []*pb.WatchResponse) int {
	n := 0
	for _, r := range resps {
		n += max(1, len(r.Events))
	}
	return n
}

func eventStr(ev *mvccpb.Event) string {
	s := fmt.Sprintf("%s %s", ev.Type, kvStr(ev.Kv))
	if ev.PrevKv != nil {
		s += " prev=" + kvStr(ev.PrevKv)
	}
	return s
}

// transcript renders responses grouped by watch ID (sorted), each group in
// arrival order.
func transcript(resps []*pb.WatchResponse, streamErr error) string {
	groups := map[int64][]string{}
	for _, r := range resps {
		if r.Created || r.Canceled || r.CompactRevision != 0 || len(r.Events) == 0 {
			line := fmt.Sprintf("response{%s", hdrStr(r.Header))
			if r.Created {
				line += " created"
			}
			if r.Canceled {
				line += " canceled"
			}
			if r.CompactRevision != 0 {
				line += fmt.Sprintf(" compact_revision=%d", r.CompactRevision)
			}
			if r.CancelReason != "" {
				line += fmt.Sprintf(" cancel_reason=%q", r.CancelReason)
			}
			if r.Fragment {
				line += " fragment"
			}
			if len(r.Events) == 0 && !r.Created && !r.Canceled && r.CompactRevision == 0 {
				line += " (progress notification)"
			}
			line += "}"
			groups[r.WatchId] = append(groups[r.WatchId], line)
		}
		for _, ev := range r.Events {
			groups[r.WatchId] = append(groups[r.WatchId], eventStr(ev))
		}
	}
	ids := make([]int64, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "    watch_id=%d:\n", id)
		for _, l := range groups[id] {
			fmt.Fprintf(&b, "      %s\n", l)
		}
	}
	if streamErr != nil {
		fmt.Fprintf(&b, "    stream ended: %s\n", errStr(streamErr))
	}
	if b.Len() == 0 {
		return "    (no responses)\n"
	}
	return b.String()
}

// rawTranscript renders every response on its own (grouped by watch ID),
// keeping response boundaries and fragment flags (only meaningful when they are
// deterministic: synced watchers and one write per step).
func rawTranscript(resps []*pb.WatchResponse, streamErr error) string {
	resps = append([]*pb.WatchResponse(nil), resps...)
	// the order across watchers is not deterministic; within one it is
	sort.SliceStable(resps, func(i, j int) bool { return resps[i].WatchId < resps[j].WatchId })
	var b strings.Builder
	for _, r := range resps {
		fmt.Fprintf(&b, "    response{watch_id=%d created=%t canceled=%t fragment=%t compact_revision=%d events=%d}\n", r.WatchId, r.Created, r.Canceled, r.Fragment, r.CompactRevision, len(r.Events))
		for _, ev := range r.Events {
			fmt.Fprintf(&b, "      %s\n", eventStr(ev))
		}
	}
	if streamErr != nil {
		fmt.Fprintf(&b, "    stream ended: %s\n", errStr(streamErr))
	}
	return b.String()
}

// watchPair is one watch stream on each server.
type watchPair struct {
	p         *pair
	ref, cand *watchStream
	// render turns one step's responses into the compared text (default:
	// transcript, which flattens events per watch ID).
	render func([]*pb.WatchResponse, error) string
}

func (p *pair) openWatchPair(t *testing.T) *watchPair {
	wp := &watchPair{p: p, ref: openWatch(p.ref), cand: openWatch(p.cand), render: transcript}
	t.Cleanup(func() { wp.ref.close(); wp.cand.close() })
	return wp
}

// step sends req (nil: nothing) on both streams, collects the answers and
// compares the transcripts. It returns the reference's responses.
func (wp *watchPair) step(t *testing.T, desc string, req *pb.WatchRequest) []*pb.WatchResponse {
	t.Helper()
	return wp.stepAtLeast(t, desc, req, 0)
}

// stepAtLeast is step for a write whose items (see items) are known: each
// stream is collected until it gave at least want of them, then until quiet.
// A loaded machine can keep both servers quiet for longer than watchQuiet
// after a large write; the next step would then see two revisions at once,
// whose response boundaries the servers may draw differently.
func (wp *watchPair) stepAtLeast(t *testing.T, desc string, req *pb.WatchRequest, want int) []*pb.WatchResponse {
	t.Helper()
	if req != nil {
		wp.ref.send(req)
		wp.cand.send(req)
	}
	var (
		wg                 sync.WaitGroup
		refResps, canResps []*pb.WatchResponse
		refErr, canErr     error
	)
	wg.Add(2)
	go func() { defer wg.Done(); refResps, refErr = wp.ref.collectAtLeast(nil, want) }()
	go func() { defer wg.Done(); canResps, canErr = wp.cand.collectAtLeast(nil, want) }()
	wg.Wait()
	// Either server, on a loaded machine, may be quiet for longer than
	// watchQuiet before it answers (etcd catches up a watcher that starts
	// in the past on a 100 ms timer): the one with fewer items waits for as
	// many as the other gave (then until quiet), up to watchMax. A server
	// that never sends them still shows as a mismatch, only later.
	if n := items(refResps); items(canResps) < n && canErr == nil {
		canResps, canErr = wp.cand.collectAtLeast(canResps, n)
	}
	if n := items(canResps); items(refResps) < n && refErr == nil {
		refResps, refErr = wp.ref.collectAtLeast(refResps, n)
	}
	if status.Code(canErr) == codes.Unimplemented {
		t.Fatalf("%s does not implement the Watch service: %s", wp.p.cand.name, errStr(canErr))
	}
	rt, ct := wp.render(refResps, refErr), wp.render(canResps, canErr)
	t.Logf("%s:\n%s", desc, rt)
	if rt != ct {
		t.Errorf("WATCH MISMATCH after %s\n  etcd:\n%s  %s:\n%s", desc, rt, wp.p.cand.name, ct)
	}
	return refResps
}

func watchCreate(c *pb.WatchCreateRequest) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
}

func watchCancel(id int64) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
}

var watchProgress = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}

func createDesc(c *pb.WatchCreateRequest) string {
	s := "watch create " + bytesStr(c.Key) + rangeEndStr(c.RangeEnd)
	if c.StartRevision != 0 {
		s += fmt.Sprintf(" start_revision=%d", c.StartRevision)
	}
	if c.WatchId != 0 {
		s += fmt.Sprintf(" watch_id=%d", c.WatchId)
	}
	if c.PrevKv {
		s += " prev_kv"
	}
	if len(c.Filters) != 0 {
		s += fmt.Sprintf(" filters=%v", c.Filters)
	}
	return s
}

func TestWatchCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	write := func(t *testing.T, req any) {
		t.Helper()
		p.check(t, "(watch test write)", req)
	}
	// History: revisions 2..9, then compaction at 4.
	write(t, &pb.PutRequest{Key: []byte("a"), Value: []byte("1")})   // 2
	write(t, &pb.PutRequest{Key: []byte("a/b"), Value: []byte("1")}) // 3
	write(t, &pb.PutRequest{Key: []byte("b"), Value: []byte("1")})   // 4
	write(t, &pb.PutRequest{Key: []byte("a"), Value: []byte("2")})   // 5
	write(t, &pb.DeleteRangeRequest{Key: []byte("a")})               // 6
	write(t, &pb.PutRequest{Key: []byte("a/c"), Value: []byte("1")}) // 7
	write(t, txn(nil, ops(put("a", "3"), put("b", "2"), del("a/b", "")), nil))
	write(t, &pb.PutRequest{Key: []byte("\x00"), Value: []byte("n")}) // 9
	write(t, &pb.CompactionRequest{Revision: 4, Physical: true})
	cur := p.refRev(t)
	if cur != 9 {
		t.Fatalf("reference revision %d, want 9", cur)
	}

	wp := p.openWatchPair(t)
	create := func(t *testing.T, c *pb.WatchCreateRequest) {
		t.Helper()
		wp.step(t, createDesc(c), watchCreate(c))
	}
	aEnd := prefixEnd([]byte("a"))
	t.Run("create", func(t *testing.T) {
		create(t, &pb.WatchCreateRequest{Key: []byte("a")})                                                 // id 0: current
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: aEnd, StartRevision: 5, PrevKv: true}) // id 1: past, prev_kv
		create(t, &pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: 2})            // id 2: compacted
		create(t, &pb.WatchCreateRequest{Key: []byte("b"), StartRevision: cur + 3})                         // id 3: future
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: aEnd, StartRevision: 5, Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}})
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: aEnd, PrevKv: true, Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NODELETE}})
		create(t, &pb.WatchCreateRequest{Key: []byte("c"), WatchId: 100})
		create(t, &pb.WatchCreateRequest{Key: []byte("c"), WatchId: 100}) // duplicate ID
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), StartRevision: -1})
		create(t, &pb.WatchCreateRequest{})                                        // empty key means "\x00"
		create(t, &pb.WatchCreateRequest{Key: []byte("z"), RangeEnd: []byte("a")}) // inverted range
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte{0}, StartRevision: cur})
		create(t, &pb.WatchCreateRequest{Key: []byte("b"), StartRevision: 4, Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT, pb.WatchCreateRequest_NODELETE}})
		create(t, &pb.WatchCreateRequest{Key: []byte("b"), StartRevision: 4, PrevKv: true})
		wp.step(t, "watch cancel 0", watchCancel(0))
		wp.step(t, "watch cancel 999 (unknown)", watchCancel(999))
	})

	if status.Code(wp.cand.dead) == codes.Unimplemented {
		return // reported once above
	}

	t.Run("events", func(t *testing.T) {
		for _, req := range []any{
			&pb.PutRequest{Key: []byte("a"), Value: []byte("4")},
			&pb.PutRequest{Key: []byte("a/b"), Value: []byte("2")},
			&pb.DeleteRangeRequest{Key: []byte("a/b")},
			&pb.PutRequest{Key: []byte("b"), Value: []byte("3")},
			txn(nil, ops(put("a", "5"), put("a/d", "1"), put("b", "4")), nil),
			&pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: aEnd},
			&pb.PutRequest{Key: []byte("c"), Value: []byte("1")},
			&pb.PutRequest{Key: []byte("\x00"), Value: []byte("m")},
			&pb.DeleteRangeRequest{Key: []byte("nothing-here")},
			txn(nil, ops(put("b", "5"), del("c", "")), nil),
		} {
			write(t, req)
			wp.step(t, reqStr(req), nil)
		}
	})

	t.Run("progress", func(t *testing.T) {
		cur := p.refRev(t)
		// etcd answers a progress request only when every watcher of the
		// stream is synced; watcher 2 was canceled by compaction but stays
		// registered until the client cancels it.
		wp.step(t, "watch progress request (a compacted watcher is still registered)", watchProgress)
		wp.step(t, "watch cancel 2 (the compacted watcher)", watchCancel(2))
		wp.step(t, "watch progress request (all watchers synced)", watchProgress)
		create(t, &pb.WatchCreateRequest{Key: []byte("q"), StartRevision: cur + 10, WatchId: 500})
		wp.step(t, "watch progress request (a watcher waits for a future revision)", watchProgress)
		wp.step(t, "watch cancel 500", watchCancel(500))
		wp.step(t, "watch progress request (synced again)", watchProgress)

		wp3 := p.openWatchPair(t)
		wp3.step(t, "new stream: watch progress request without watchers", watchProgress)
		wp3.step(t, "new stream: watch create x", watchCreate(&pb.WatchCreateRequest{Key: []byte("x")}))
		wp3.step(t, "new stream: watch progress request", watchProgress)
		wp3.step(t, "new stream: watch create y at the next revision", watchCreate(&pb.WatchCreateRequest{Key: []byte("y"), StartRevision: cur + 1}))
		wp3.step(t, "new stream: watch progress request", watchProgress)
	})

	t.Run("compaction-between", func(t *testing.T) {
		write(t, &pb.CompactionRequest{Revision: 14, Physical: true})
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: aEnd, StartRevision: 10})
		create(t, &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: aEnd, StartRevision: 14, PrevKv: true})
		create(t, &pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: 15})
		write(t, &pb.PutRequest{Key: []byte("a"), Value: []byte("6")})
		wp.step(t, "put a=6", nil)
	})

	t.Run("fragment", func(t *testing.T) {
		// Responses bigger than the request limit (1.5 MiB) are split into
		// fragments for watchers created with fragment=true.
		wp4 := p.openWatchPair(t)
		wp4.render = rawTranscript
		big := func(c byte) string { return strings.Repeat(string(c), 700*1024) }
		wp4.step(t, "watch create big/ prev_kv fragment", watchCreate(&pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: prefixEnd([]byte("big/")), PrevKv: true, Fragment: true}))
		wp4.step(t, "watch create big/ prev_kv (no fragment)", watchCreate(&pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: prefixEnd([]byte("big/")), PrevKv: true}))
		for i, c := range []byte{'x', 'y'} {
			req := txn(nil, ops(put("big/1", big(c)), put("big/2", big(c))), nil)
			write(t, req)
			// two events on each of the two watchers
			wp4.stepAtLeast(t, fmt.Sprintf("txn #%d putting two 700 KiB values", i+1), nil, 4)
		}
		write(t, &pb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: prefixEnd([]byte("big/"))})
		wp4.stepAtLeast(t, "delete big/", nil, 4)
	})

	t.Run("second-stream", func(t *testing.T) {
		wp2 := p.openWatchPair(t)
		wp2.step(t, "second stream: watch create a", watchCreate(&pb.WatchCreateRequest{Key: []byte("a"), PrevKv: true}))
		write(t, &pb.PutRequest{Key: []byte("a"), Value: []byte("7")})
		wp2.step(t, "second stream after put a=7", nil)
		wp.step(t, "first stream after put a=7", nil)
	})
}

// TestWatchRandomCompat puts watchers with random ranges, start revisions
// and options on a store with random history, then runs more random KV
// operations and compares every event each watcher receives.
func TestWatchRandomCompat(t *testing.T) {
	t.Parallel()
	seed := int64(21)
	if *flagSeed != 0 {
		seed = *flagSeed
	}
	t.Logf("seed %d (reproduce: go test -run 'TestWatchRandomCompat$' -seed %d)", seed, seed)
	p := startPair(t)
	compacted := runRandomSequence(t, p, seed, 150, seqOpts{compactRev: -1, avoidQuirks: true})
	cur := p.refRev(t)

	g := newGen(seed + 1000)
	g.curRev, g.compactRev = cur, compacted
	wp := p.openWatchPair(t)
	for i := range 10 {
		c := &pb.WatchCreateRequest{Key: g.key(), PrevKv: g.p(0.4), Fragment: g.p(0.2)}
		c.RangeEnd = g.rangeEnd(c.Key, 0.3)
		switch x := g.intn(10); {
		case x < 3:
			c.StartRevision = 0
		case x < 8:
			c.StartRevision = g.between(max(compacted, 1), cur)
		case x < 9:
			c.StartRevision = cur + g.between(1, 20)
		default:
			c.StartRevision = g.between(1, max(compacted, 1))
		}
		if g.p(0.15) {
			c.Filters = append(c.Filters, pb.WatchCreateRequest_NOPUT)
		}
		if g.p(0.15) {
			c.Filters = append(c.Filters, pb.WatchCreateRequest_NODELETE)
		}
		wp.step(t, fmt.Sprintf("watcher %d: %s", i, createDesc(c)), watchCreate(c))
		if status.Code(wp.cand.dead) == codes.Unimplemented {
			return
		}
	}
	runRandomSequence(t, p, seed+1, 250, seqOpts{compactRev: compacted, avoidQuirks: true})
	wp.step(t, "events of 250 random operations", nil)
	wp.step(t, "watch progress request", watchProgress)
}
