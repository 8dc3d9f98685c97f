package watch_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
)

const waitLong = 20 * time.Second

func start(t *testing.T, cfg server.Config) *testserver.Server {
	t.Helper()
	return testserver.Start(t, testserver.Options{DB: testdb.Open(t), Config: cfg})
}

// awaitReady waits until s answers /readyz, which waits for the watch hub
// to dispatch every revision committed when it was asked.
func awaitReady(t *testing.T, s *testserver.Server) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, s.Addr+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %s %s", resp.Status, body)
	}
}

// metric is the value of the metric name with the given label pairs, as a
// scrape of s sees it now.
func metric(t *testing.T, s *testserver.Server, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := s.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawStream is a Watch stream spoken in etcd's protocol directly, to see
// every response as the server sends it.
type rawStream struct {
	t      *testing.T
	stream pb.Watch_WatchClient
	cancel context.CancelFunc
	ch     chan *pb.WatchResponse
	errc   chan error
}

func openRaw(t *testing.T, conn grpc.ClientConnInterface, read bool) *rawStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &rawStream{t: t, stream: st, cancel: cancel, ch: make(chan *pb.WatchResponse, 1<<16), errc: make(chan error, 1)}
	t.Cleanup(cancel)
	if read {
		r.startReading()
	}
	return r
}

func (r *rawStream) startReading() {
	go func() {
		for {
			resp, err := r.stream.Recv()
			if err != nil {
				r.errc <- err
				return
			}
			r.ch <- resp
		}
	}()
}

func (r *rawStream) send(req *pb.WatchRequest) {
	r.t.Helper()
	if err := r.stream.Send(req); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

func (r *rawStream) create(c *pb.WatchCreateRequest) {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: c}})
}

func (r *rawStream) cancelWatch(id int64) {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}})
}

func (r *rawStream) requestProgress() {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
}

// next returns the next response, failing the test after d.
func (r *rawStream) next(d time.Duration) *pb.WatchResponse {
	r.t.Helper()
	select {
	case resp := <-r.ch:
		return resp
	case err := <-r.errc:
		r.t.Fatalf("stream ended: %v", err)
	case <-time.After(d):
		r.t.Fatalf("no watch response within %v", d)
	}
	return nil
}

// none fails if a response arrives within d.
func (r *rawStream) none(d time.Duration) {
	r.t.Helper()
	select {
	case resp := <-r.ch:
		r.t.Fatalf("unexpected response: %s", respStr(resp))
	case err := <-r.errc:
		r.t.Fatalf("stream ended: %v", err)
	case <-time.After(d):
	}
}

// created waits for a created response and returns its watch id.
func (r *rawStream) created() int64 {
	r.t.Helper()
	resp := r.next(waitLong)
	if !resp.Created || resp.Canceled {
		r.t.Fatalf("want a created response, got %s", respStr(resp))
	}
	return resp.WatchId
}

func isProgress(r *pb.WatchResponse) bool {
	return len(r.Events) == 0 && !r.Created && !r.Canceled && r.CompactRevision == 0 && r.Header.GetRevision() != 0
}

func respStr(r *pb.WatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{id=%d rev=%d", r.WatchId, r.Header.GetRevision())
	if r.Created {
		b.WriteString(" created")
	}
	if r.Canceled {
		b.WriteString(" canceled")
	}
	if r.CompactRevision != 0 {
		fmt.Fprintf(&b, " compact=%d", r.CompactRevision)
	}
	if r.CancelReason != "" {
		fmt.Fprintf(&b, " reason=%q", r.CancelReason)
	}
	if r.Fragment {
		b.WriteString(" fragment")
	}
	if isProgress(r) {
		b.WriteString(" progress")
	}
	for _, ev := range r.Events {
		b.WriteString(" " + evStr(ev))
	}
	b.WriteString("}")
	return b.String()
}

func evStr(ev *mvccpb.Event) string {
	s := fmt.Sprintf("%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
	if ev.PrevKv != nil {
		s += fmt.Sprintf(" prev@%d", ev.PrevKv.ModRevision)
	}
	return s
}

// put writes and returns the revision.
func put(t *testing.T, c *clientv3.Client, key, val string) int64 {
	t.Helper()
	r, err := c.Put(context.Background(), key, val)
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func del(t *testing.T, c *clientv3.Client, key string, opts ...clientv3.OpOption) int64 {
	t.Helper()
	r, err := c.Delete(context.Background(), key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func rev(t *testing.T, c *clientv3.Client) int64 {
	t.Helper()
	r, err := c.Get(context.Background(), "any-key", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// collect reads n events from a clientv3 watch channel, failing on a
// closed channel or a timeout.
func collect(t *testing.T, wch clientv3.WatchChan, n int) []*clientv3.Event {
	t.Helper()
	var out []*clientv3.Event
	deadline := time.After(waitLong)
	for len(out) < n {
		select {
		case wr, ok := <-wch:
			if !ok {
				t.Fatalf("watch channel closed after %d of %d events", len(out), n)
			}
			if err := wr.Err(); err != nil {
				t.Fatalf("watch error after %d of %d events: %v", len(out), n, err)
			}
			out = append(out, wr.Events...)
		case <-deadline:
			t.Fatalf("got %d of %d events", len(out), n)
		}
	}
	if len(out) > n {
		t.Fatalf("got %d events, want %d", len(out), n)
	}
	return out
}
