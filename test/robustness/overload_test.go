package robustness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// overloadServer starts fdb-etcd with a metrics listener (to watch its
// watcher and goroutine counts) and returns it with a client.
func overloadServer(t *testing.T) (*server, *clientv3.Client, string) {
	metricsAddr := freeAddr(t)
	s := startServer(t, "--listen-metrics-urls", "http://"+metricsAddr)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		MaxCallSendMsgSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	url := "http://" + metricsAddr + "/metrics"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics listener: %v", err)
		}
	}
	return s, cli, url
}

// metric reads one unlabelled gauge from the metrics endpoint.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, name+" "), 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// storedState is what must not change under bad input: the revision, the
// KV hash and every key and value.
type storedState struct {
	rev  int64
	hash uint32
	dump string
}

func snapshot(t *testing.T, cli *clientv3.Client, endpoint string) storedState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := cli.HashKV(ctx, endpoint, 0)
	if err != nil {
		t.Fatal(err)
	}
	all, err := cli.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range all.Kvs {
		fmt.Fprintf(&b, "%q=%x@%d/%d/%d;", kv.Key, kv.Value, kv.ModRevision, kv.CreateRevision, kv.Version)
	}
	return storedState{rev: all.Header.Revision, hash: h.Hash, dump: b.String()}
}

// rawCodec sends bytes as they are, to put malformed protobuf on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// TestBadInput sends oversize requests and messages, malformed ranges,
// malformed protobuf and binary (invalid UTF-8) keys. Each gets etcd's
// error (or etcd's answer), and nothing stored changes.
func TestBadInput(t *testing.T) {
	s, cli, _ := overloadServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Keys are bytes: invalid UTF-8, NUL and 0xff keys are stored exactly.
	bin := []string{"\xff\xfe\xfd", "\x00a", "a\x00", "\xc3\x28", "k\xff"}
	for i, k := range bin {
		if _, err := cli.Put(ctx, k, fmt.Sprintf("v%d\xff", i)); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
		r, err := cli.Get(ctx, k)
		if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Key) != k || string(r.Kvs[0].Value) != fmt.Sprintf("v%d\xff", i) {
			t.Fatalf("binary key %q reads back %v %v", k, r, err)
		}
	}
	big := bytes.Repeat([]byte("x"), 1<<20) // chunked in storage
	if _, err := cli.Put(ctx, "big", string(big)); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, cli, s.endpoint())

	conn, err := grpc.NewClient(s.endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	put := func(k string, v []byte) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: v}}}
	}
	many := make([]*pb.RequestOp, 129)
	for i := range many {
		many[i] = put(fmt.Sprintf("m%d", i), nil)
	}
	cases := []struct {
		name string
		call func() error
		want error // nil: want code
		code codes.Code
	}{
		{"value over --max-request-bytes", func() error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("x"), Value: make([]byte, 1536*1024+1)})
			return err
		}, rpctypes.ErrGRPCRequestTooLarge, 0},
		{"message over the gRPC limit", func() error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("x"), Value: make([]byte, 3<<20)})
			return err
		}, nil, codes.ResourceExhausted},
		{"txn over the gRPC limit", func() error {
			ops := []*pb.RequestOp{put("t1", make([]byte, 1<<20)), put("t2", make([]byte, 1<<20)), put("t3", make([]byte, 1<<20))}
			_, err := kv.Txn(ctx, &pb.TxnRequest{Success: ops})
			return err
		}, nil, codes.ResourceExhausted},
		{"txn over --max-request-bytes", func() error {
			ops := []*pb.RequestOp{put("t1", make([]byte, 800<<10)), put("t2", make([]byte, 800<<10))}
			_, err := kv.Txn(ctx, &pb.TxnRequest{Success: ops})
			return err
		}, rpctypes.ErrGRPCRequestTooLarge, 0},
		{"129 txn ops", func() error {
			_, err := kv.Txn(ctx, &pb.TxnRequest{Success: many})
			return err
		}, rpctypes.ErrGRPCTooManyOps, 0},
		{"empty key put", func() error { _, err := kv.Put(ctx, &pb.PutRequest{Value: []byte("v")}); return err }, rpctypes.ErrGRPCEmptyKey, 0},
		{"empty key range", func() error { _, err := kv.Range(ctx, &pb.RangeRequest{}); return err }, rpctypes.ErrGRPCEmptyKey, 0},
		{"empty key delete", func() error { _, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{}); return err }, rpctypes.ErrGRPCEmptyKey, 0},
		{"inverted range", func() error {
			r, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("z"), RangeEnd: []byte("a")})
			if err == nil && (len(r.Kvs) != 0 || r.Count != 0) {
				return fmt.Errorf("inverted range returned %d keys", len(r.Kvs))
			}
			return err
		}, nil, codes.OK},
		{"inverted delete", func() error {
			r, err := kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("z"), RangeEnd: []byte("a")})
			if err == nil && r.Deleted != 0 {
				return fmt.Errorf("inverted delete removed %d keys", r.Deleted)
			}
			return err
		}, nil, codes.OK},
		{"future revision", func() error {
			_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a"), Revision: 1 << 40})
			return err
		}, rpctypes.ErrGRPCFutureRev, 0},
		{"invalid sort", func() error {
			_, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("a"), SortOrder: 9})
			return err
		}, rpctypes.ErrGRPCInvalidSortOption, 0},
		{"key longer than storage allows", func() error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: bytes.Repeat([]byte("k"), 20_000), Value: []byte("v")})
			return err
		}, rpctypes.ErrGRPCRequestTooLarge, 0},
		{"compare on a missing lease", func() error {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("l"), Lease: 12345})
			return err
		}, rpctypes.ErrGRPCLeaseNotFound, 0},
		{"malformed protobuf", func() error {
			in, out := []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 1}, []byte(nil)
			return conn.Invoke(ctx, "/etcdserverpb.KV/Put", &in, &out, grpc.ForceCodec(rawCodec{}))
		}, nil, codes.Internal},
	}
	for _, c := range cases {
		err := c.call()
		switch {
		case c.want != nil:
			if status.Code(err) != status.Code(c.want) || status.Convert(err).Message() != status.Convert(c.want).Message() {
				t.Errorf("%s: got %v, want etcd's %v", c.name, err, c.want)
			}
		case status.Code(err) != c.code:
			t.Errorf("%s: got %v, want code %v", c.name, err, c.code)
		}
	}
	if after := snapshot(t, cli, s.endpoint()); after != before {
		t.Fatalf("bad input changed the store: revision %d -> %d, hash %d -> %d", before.rev, after.rev, before.hash, after.hash)
	}
	if !s.alive() {
		t.Fatal("server died")
	}
}

// TestOverload opens 10,000 watch streams at once and abandons them.
// Throughout, a sentinel client's requests must keep succeeding, the
// server's memory must stay bounded, abandoned watchers must be released, and
// nothing stored may change except the sentinel's own key.
func TestOverload(t *testing.T) {
	s, cli, metrics := overloadServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := 0; i < 50; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("data/%03d", i), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	dataBefore, err := cli.Get(ctx, "data/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	rss0 := s.rssKiB()
	goroutines0 := metric(t, metrics, "go_goroutines")

	// The sentinel: a client doing small writes and reads all along.
	var sentinelOK, sentinelErr atomic.Int64
	var worst atomic.Int64
	stopSentinel := make(chan struct{})
	var swg sync.WaitGroup
	swg.Add(1)
	go func() {
		defer swg.Done()
		for i := 0; ; i++ {
			select {
			case <-stopSentinel:
				return
			case <-time.After(50 * time.Millisecond):
			}
			start := time.Now()
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := cli.Put(rctx, "sentinel", fmt.Sprint(i))
			if err == nil {
				_, err = cli.Get(rctx, "data/000")
			}
			rcancel()
			if err != nil {
				sentinelErr.Add(1)
				continue
			}
			sentinelOK.Add(1)
			if d := time.Since(start).Milliseconds(); d > worst.Load() {
				worst.Store(d)
			}
		}
	}()
	var rssMax atomic.Int64
	sample := func() { rssMax.Store(max(rssMax.Load(), s.rssKiB())) }

	// Phase 1: 10,000 watch streams over 20 connections, opened at once,
	// then abandoned three ways: stream cancelled, connection closed, and
	// left unread until the connection goes.
	const conns, perConn = 20, 500
	var created atomic.Int64
	var opened sync.WaitGroup
	var cs []*grpc.ClientConn
	var cancels []context.CancelFunc
	var mu sync.Mutex
	for c := 0; c < conns; c++ {
		conn, err := grpc.NewClient(s.endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, conn)
		for i := 0; i < perConn; i++ {
			opened.Add(1)
			go func(c, i int) {
				defer opened.Done()
				sctx, scancel := context.WithCancel(ctx)
				mu.Lock()
				cancels = append(cancels, scancel)
				mu.Unlock()
				st, err := pb.NewWatchClient(conn).Watch(sctx)
				if err != nil {
					return
				}
				key := []byte(fmt.Sprintf("data/%03d", i%50))
				var end []byte
				if i%4 == 0 {
					key, end = []byte("data/"), []byte("data0") // a prefix, from the start
				}
				if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
					Key: key, RangeEnd: end, StartRevision: int64(1 + i%3), PrevKv: i%2 == 0}}}); err != nil {
					return
				}
				if i%5 != 0 { // most read their creation; every fifth never reads at all
					if r, err := st.Recv(); err == nil && r.Created {
						created.Add(1)
					}
				}
			}(c, i)
		}
	}
	opened.Wait()
	sample()
	peakWatchers := metric(t, metrics, "etcd_debugging_mvcc_watcher_total")
	sample()
	t.Logf("10,000 streams: %d creations read, %v watchers, RSS %d -> %d KiB", created.Load(), peakWatchers, rss0, s.rssKiB())
	if peakWatchers < 9000 {
		t.Errorf("only %v of 10,000 watchers registered", peakWatchers)
	}
	// Abandon: a third by cancelling the stream, the rest by closing their
	// connections (unread streams included).
	for i, c := range cancels {
		if i%3 == 0 {
			c()
		}
	}
	for _, c := range cs {
		c.Close()
	}
	for _, c := range cancels {
		c()
	}
	released := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		sample()
		if metric(t, metrics, "etcd_debugging_mvcc_watcher_total") == 0 {
			released = true
			break
		}
	}
	if !released {
		t.Errorf("abandoned watchers not released after 30s: %v remain", metric(t, metrics, "etcd_debugging_mvcc_watcher_total"))
	}

	// The phases can end within a couple of seconds; let the sentinel reach
	// its tenth request so that "served throughout" does not hinge on how
	// fast the storm passed.
	for deadline := time.Now().Add(30 * time.Second); sentinelOK.Load()+sentinelErr.Load() < 10 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	close(stopSentinel)
	swg.Wait()

	t.Logf("sentinel: %d ok, %d failed, worst %d ms; RSS start %d KiB, max %d KiB; goroutines %v -> %v",
		sentinelOK.Load(), sentinelErr.Load(), worst.Load(), rss0, rssMax.Load(), goroutines0, metric(t, metrics, "go_goroutines"))
	if sentinelErr.Load() > 0 || sentinelOK.Load() < 10 {
		t.Errorf("the sentinel client was not served throughout: %d ok, %d failed", sentinelOK.Load(), sentinelErr.Load())
	}
	// 10,000 watch streams (about 30,000 goroutines, most of the cost in
	// their stacks) must fit in a bounded amount of memory: 150 KiB each.
	if limit := rss0 + 10_000*150; rssMax.Load() > limit {
		t.Errorf("memory not bounded: RSS peaked at %d KiB (start %d KiB, limit %d KiB)", rssMax.Load(), rss0, limit)
	}
	dataAfter, err := cli.Get(ctx, "data/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(dataAfter.Kvs) != fmt.Sprint(dataBefore.Kvs) {
		t.Fatal("stored data changed under overload")
	}
	if !s.alive() {
		t.Fatal("server died")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("overload test ran out of time")
	}
}

// TestUnreadWatchers runs watchers that never read (prev_kv, on the keys
// being written) while 128 MiB of 1 MiB values are written: the server must
// apply backpressure instead of buffering everything for each of them, keep
// serving other clients, and release the streams when they go.
func TestUnreadWatchers(t *testing.T) {
	s, cli, metrics := overloadServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const stalled, puts = 8, 128
	var streams []pb.Watch_WatchClient
	heap0 := metric(t, metrics, "go_memstats_heap_inuse_bytes")
	var rssMax atomic.Int64
	sample := func() { rssMax.Store(max(rssMax.Load(), s.rssKiB())) }
	var scs []*grpc.ClientConn
	for i := 0; i < stalled; i++ {
		conn, err := grpc.NewClient(s.endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32))) // as clientv3
		if err != nil {
			t.Fatal(err)
		}
		scs = append(scs, conn)
		st, err := pb.NewWatchClient(conn).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
		if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte("blob/"), RangeEnd: []byte("blob0"), PrevKv: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	var heapMax float64
	sampleHeap := func() { heapMax = max(heapMax, metric(t, metrics, "go_memstats_heap_inuse_bytes")) }
	blob := bytes.Repeat([]byte("b"), 1<<20)
	for i := 0; i < puts; i++ {
		blob[0] = byte(i)
		if _, err := cli.Put(ctx, fmt.Sprintf("blob/%d", i%4), string(blob)); err != nil {
			t.Fatal(err)
		}
		sample()
		sampleHeap()
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		sample()
		sampleHeap()
	}
	t.Logf("%d unread watchers of %d x 1 MiB puts: heap in use peaked at %.0f MiB (from %.0f MiB)", stalled, puts, heapMax/(1<<20), heap0/(1<<20))
	// Buffering every unread stream would hold 8 x 128 MiB, twice with
	// prev_kv. Each stream's queue is bounded (16 MiB by default) and so is
	// what gRPC holds per stream.
	if heapMax > 512<<20 {
		t.Errorf("unread watchers are buffered without bound: heap in use peaked at %.0f MiB", heapMax/(1<<20))
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	// Backpressure, not loss: an unread stream, read now, has every event
	// in order, each with the previous version.
	var got []*mvccpb.Event
	var hdr int64
	for len(got) < puts {
		r, err := recvWithContext(pctx, streams[0])
		if err != nil {
			t.Fatalf("draining an unread watcher after %d events: %v", len(got), err)
		}
		if r.Canceled {
			t.Fatalf("unread watcher canceled: %v", r)
		}
		got = append(got, r.Events...)
		hdr = r.Header.Revision
	}
	for i, ev := range got {
		if len(ev.Kv.Value) != 1<<20 || ev.Kv.Value[0] != byte(i) || string(ev.Kv.Key) != fmt.Sprintf("blob/%d", i%4) ||
			i > 0 && ev.Kv.ModRevision != got[i-1].Kv.ModRevision+1 || ev.Kv.ModRevision > hdr {
			t.Fatalf("event %d of the unread watcher: %s@%d (%d bytes)", i, ev.Kv.Key, ev.Kv.ModRevision, len(ev.Kv.Value))
		}
		if i >= 4 && (ev.PrevKv == nil || ev.PrevKv.ModRevision != got[i-4].Kv.ModRevision || ev.PrevKv.Value[0] != byte(i-4)) {
			t.Fatalf("event %d of the unread watcher: wrong prev_kv", i)
		}
	}
	if _, err := cli.Get(pctx, "blob/0", clientv3.WithKeysOnly()); err != nil {
		t.Fatalf("server not serving with unread watchers: %v", err)
	}
	for _, c := range scs {
		c.Close()
	}
	for deadline := time.Now().Add(30 * time.Second); metric(t, metrics, "etcd_debugging_mvcc_watcher_total") != 0; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("unread watchers not released after their connections closed")
		}
	}
	t.Logf("RSS peaked at %d KiB", rssMax.Load())
}
