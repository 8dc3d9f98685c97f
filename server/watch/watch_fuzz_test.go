package watch_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// watchFuzzInput encodes a sequence of watch requests as the fuzzer's input:
// each a uvarint length and a marshaled WatchRequest.
func watchFuzzInput(reqs ...*pb.WatchRequest) []byte {
	var out []byte
	for _, r := range reqs {
		b, _ := proto.Marshal(r)
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

func fuzzCreate(c *pb.WatchCreateRequest) *pb.WatchRequest {
	return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}}
}

// FuzzWatchRequests sends arbitrary sequences of watch requests (creates with
// any key, range, start revision, filters, ids, fragment and prev_kv flags;
// cancels; progress requests; unknown request kinds) on one stream. The
// server must not crash, every response must carry a header, events may only
// arrive for watches the stream created, in revision order, a stream that
// ends must end with one of etcd's errors, and the server keeps serving.
func FuzzWatchRequests(f *testing.F) {
	f.Add(watchFuzzInput(fuzzCreate(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("z"), StartRevision: 1, PrevKv: true})))
	f.Add(watchFuzzInput(fuzzCreate(&pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, WatchId: 7, ProgressNotify: true, Fragment: true}),
		&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 7}}}))
	f.Add(watchFuzzInput(fuzzCreate(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: -3}),
		fuzzCreate(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: 1 << 40}),
		fuzzCreate(&pb.WatchCreateRequest{WatchId: -1, Filters: []pb.WatchCreateRequest_FilterType{0, 1, 7}})))
	f.Add(watchFuzzInput(fuzzCreate(&pb.WatchCreateRequest{Key: []byte("b"), WatchId: 1}), fuzzCreate(&pb.WatchCreateRequest{Key: []byte("b"), WatchId: 1}),
		&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}, &pb.WatchRequest{}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2})
	db, err := pebble.Open(f.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	// No test logger: server goroutines must not call *F methods while the
	// fuzzer runs.
	srv := testserver.Start(f, testserver.Options{DB: db, Config: server.Config{Logger: zap.NewNop()}})
	for _, k := range []string{"a", "b", "k", "z", "\x00"} {
		if _, err := srv.Client.Put(context.Background(), k, "v"); err != nil {
			f.Fatal(err)
		}
	}
	// Each input costs a round trip to the server; fuzz with a small
	// -fuzzminimizetime (make fuzz-short does).
	f.Fuzz(func(t *testing.T, data []byte) { watchExchange(t, srv, data) })
}

// watchExchange sends the requests data encodes on a new stream and checks
// the responses and that the server still serves.
func watchExchange(t *testing.T, srv *testserver.Server, data []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	st, err := pb.NewWatchClient(srv.Client.ActiveConnection()).Watch(sctx)
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; len(data) > 0 && n < 16; n++ {
		l, k := binary.Uvarint(data)
		if k <= 0 || l > uint64(len(data)-k) {
			break
		}
		var req pb.WatchRequest
		msg := data[k : k+int(l)]
		data = data[k+int(l):]
		if proto.Unmarshal(msg, &req) != nil {
			continue
		}
		if err := st.Send(&req); err != nil {
			break // the server ended the stream; Recv reports why
		}
	}
	if _, err := srv.Client.Put(ctx, "a", "w"); err != nil { // something to watch
		t.Fatal(err)
	}
	// A progress response (once every watcher is synced) closes the
	// exchange; watchers that cannot sync (future revisions) hold it.
	_ = st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})

	type res struct {
		r   *pb.WatchResponse
		err error
	}
	ch := make(chan res, 64)
	go func() {
		for {
			r, err := st.Recv()
			ch <- res{r, err}
			if err != nil {
				return
			}
		}
	}()
	created := map[int64]bool{}
	lastRev := map[int64]int64{}
	deadline := time.After(300 * time.Millisecond)
read:
	for {
		select {
		case <-deadline:
			break read
		case x := <-ch:
			if x.err != nil {
				if errors.Is(x.err, io.EOF) {
					break read
				}
				switch status.Code(x.err) {
				case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.ResourceExhausted, codes.Canceled, codes.Unavailable:
				default:
					t.Fatalf("stream ended with %v", x.err)
				}
				break read
			}
			r := x.r
			if r.Header == nil || r.Header.Revision < 1 {
				t.Fatalf("response without a header revision: %v", r)
			}
			if r.Created {
				created[r.WatchId] = true
			}
			if isProgress(r) && r.WatchId == -1 {
				break read // the answer to the final progress request
			}
			if len(r.Events) > 0 && !created[r.WatchId] {
				t.Fatalf("events for watch %d, which this stream did not create: %v", r.WatchId, r)
			}
			for _, ev := range r.Events {
				if ev.Kv == nil || ev.Kv.ModRevision < lastRev[r.WatchId] || ev.Kv.ModRevision > r.Header.Revision {
					t.Fatalf("watch %d: event out of order or ahead of the header: %v", r.WatchId, r)
				}
				lastRev[r.WatchId] = ev.Kv.ModRevision
			}
		}
	}
	scancel()
	// The server keeps serving everyone else.
	if _, err := srv.Client.Get(ctx, "a"); err != nil {
		t.Fatalf("server stopped serving: %v", err)
	}
}
