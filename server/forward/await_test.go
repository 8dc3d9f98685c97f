package forward

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/owner"
)

// handOver is an Owner whose view a test sets, closing Changed as the
// elector does.
type handOver struct {
	mu      sync.Mutex
	view    owner.View
	changed chan struct{}
}

func (h *handOver) View() owner.View {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.view
}

func (h *handOver) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *handOver) set(v owner.View) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.view = v
	close(h.changed)
	h.changed = make(chan struct{})
}

type countingObserver struct {
	mu     sync.Mutex
	counts map[string]int
}

func (o *countingObserver) ForwardedWrite(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[result]++
}

// TestWriteWaitsForATakeover: while nobody owns writes (the owner's record
// lapsed, the takeover not yet done), a write waits for the new owner and
// goes to it, instead of committing here, where it would race the new
// owner's commits on the head revision.
func TestWriteWaitsForATakeover(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	own := &handOver{changed: make(chan struct{})}
	peers := NewPeers(nil)
	t.Cleanup(peers.Close)
	obs := &countingObserver{counts: map[string]int{}}
	f := New(own, peers, obs)
	go func() {
		time.Sleep(50 * time.Millisecond)
		own.set(owner.View{Epoch: 2, ID: 7, URL: "http://" + lis.Addr().String()})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, ok := f.target(ctx); !ok {
		t.Fatalf("a write while nobody owned ran here (%v), want it sent to the owner that took over", obs.counts)
	}

	// Nobody takes over: after connectWait the write runs here.
	own.set(owner.View{})
	start := time.Now()
	if _, ok := f.target(ctx); ok {
		t.Fatal("a write with no owner was sent somewhere")
	}
	if took := time.Since(start); took < connectWait/2 {
		t.Errorf("a write with no owner ran here after %v, without waiting for a takeover", took)
	}
}
