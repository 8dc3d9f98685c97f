package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/owner/ownertest"
)

type countingObserver struct {
	mu     sync.Mutex
	counts map[string]int
}

func (o *countingObserver) ForwardedWrite(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[result]++
}

// serveOwner serves kv (nothing if nil) on a loopback port and returns the
// URL a forwarder reaches it at.
func serveOwner(t *testing.T, kv pb.KVServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if kv != nil {
		pb.RegisterKVServer(srv, kv)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

// deadOwner returns a loopback URL that refuses connections: an owner that
// died.
func deadOwner(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + lis.Addr().String()
	_ = lis.Close()
	return url
}

// TestWriteWaitsForATakeover: while nobody owns writes (the owner's record
// lapsed, the takeover not yet done), a write waits for the new owner and
// goes to it, instead of committing here, where it would race the new
// owner's commits on the head revision.
func TestWriteWaitsForATakeover(t *testing.T) {
	ownerURL := serveOwner(t, nil)

	own := ownertest.New(owner.View{})
	peers := NewPeers(nil, nil)
	t.Cleanup(peers.Close)
	obs := &countingObserver{counts: map[string]int{}}
	f := New(own, peers, obs)
	go func() {
		time.Sleep(50 * time.Millisecond)
		own.Set(owner.View{Epoch: 2, ID: 7, URL: ownerURL})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, ok := f.target(ctx); !ok {
		t.Fatalf("a write while nobody owned ran here (%v), want it sent to the owner that took over", obs.counts)
	}
	if own.Refreshes() == 0 {
		t.Error("a write while nobody owned did not ask for the record to be read again")
	}

	// Nobody takes over: after connectWait the write runs here.
	own.Set(owner.View{})
	start := time.Now()
	if _, ok := f.target(ctx); ok {
		t.Fatal("a write with no owner was sent somewhere")
	}
	if took := time.Since(start); took < connectWait/2 {
		t.Errorf("a write with no owner ran here after %v, without waiting for a takeover", took)
	}
}

// ownerKV answers every Put at revision 42.
type ownerKV struct{ pb.UnimplementedKVServer }

func (ownerKV) Put(context.Context, *pb.PutRequest) (*pb.PutResponse, error) {
	return &pb.PutResponse{Header: &pb.ResponseHeader{Revision: 42}}, nil
}

// yieldingStore is a local store whose write, committing while ownership
// moves to a reachable owner, gives way (mvcc.ErrYielded) as the
// sequencer's Yield would have it.
type yieldingStore struct {
	mvcc.Evaluator
	own   *ownertest.Views
	owner owner.View
	puts  int
}

func (s *yieldingStore) Put(context.Context, *pb.PutRequest) (*pb.PutResponse, error) {
	s.puts++
	s.own.Set(s.owner)
	return nil, fmt.Errorf("%w (test)", mvcc.ErrYielded)
}

// TestYieldedWriteGoesToTheOwner: a write this replica was committing
// itself (the owner it knew was unreachable) that yielded when a reachable
// replica took over is sent to that owner, and its answer is the client's.
func TestYieldedWriteGoesToTheOwner(t *testing.T) {
	ownerURL := serveOwner(t, ownerKV{})
	deadURL := deadOwner(t)

	own := ownertest.New(owner.View{Epoch: 1, ID: 5, URL: deadURL})
	peers := NewPeers(nil, nil)
	t.Cleanup(peers.Close)
	obs := &countingObserver{counts: map[string]int{}}
	local := &yieldingStore{own: own, owner: owner.View{Epoch: 2, ID: 7, URL: ownerURL}}
	f := New(own, peers, obs)
	kv := f.KV(local)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	if err != nil || resp.Header.Revision != 42 {
		t.Fatalf("put = %v, %v; want the new owner's answer (revision 42)", resp, err)
	}
	if local.puts != 1 || obs.counts["local"] != 1 || obs.counts["yielded"] != 1 || obs.counts["ok"] != 1 {
		t.Errorf("local puts %d, outcomes %v; want 1 local attempt that yielded, then 1 forwarded", local.puts, obs.counts)
	}

	// A write another replica forwarded here that yields is not sent on:
	// it fails (etcd's "leader changed", by errmap) for that replica to
	// pass on.
	own.Set(owner.View{Epoch: 1, ID: 5, URL: deadURL})
	fwd := metadata.NewIncomingContext(ctx, metadata.Pairs(forwardedKey, "1"))
	if _, err := kv.Put(fwd, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}); !errors.Is(err, mvcc.ErrYielded) {
		t.Errorf("a forwarded write that yielded: %v, want ErrYielded", err)
	}
	if local.puts != 2 || obs.counts["ok"] != 1 {
		t.Errorf("a forwarded write that yielded ran %d more times here and was forwarded %d more times; want 1 and 0", local.puts-1, obs.counts["ok"]-1)
	}

	// Yield, which the sequencer asks, says the same: only a reachable
	// owner other than this replica is worth giving way to.
	if !f.Yield() {
		t.Error("Yield = false with another owner connected")
	}
	own.Set(owner.View{Held: true, Epoch: 3, ID: 9, URL: "http://self"})
	if f.Yield() {
		t.Error("Yield = true while this replica owns writes")
	}
	own.Set(owner.View{Epoch: 4, ID: 5, URL: deadURL})
	if f.Yield() {
		t.Error("Yield = true with the owner unreachable")
	}
}

// TestUnreachableOwnerIsLookedUpAgain: a write that runs here because the
// owner it names is unreachable asks for the owner to be looked up again,
// and so does each retry of a local batch (Yield) while that owner is not
// connected or nobody owns; Yield also connects to the owner it names, so that once the
// view names a live owner a retry gives way to it without a new write
// having dialed it first.
func TestUnreachableOwnerIsLookedUpAgain(t *testing.T) {
	deadURL := deadOwner(t)
	own := ownertest.New(owner.View{Epoch: 1, ID: 5, URL: deadURL})
	peers := NewPeers(nil, nil)
	t.Cleanup(peers.Close)
	f := New(own, peers, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, ok := f.target(ctx); ok {
		t.Fatal("a write was sent to an unreachable owner")
	}
	if n := own.Refreshes(); n != 1 {
		t.Fatalf("a write that found its owner unreachable asked for %d refreshes, want 1", n)
	}
	if f.Yield() {
		t.Fatal("Yield = true with the owner unreachable")
	}
	if n := own.Refreshes(); n != 2 {
		t.Fatalf("Yield with the owner unreachable asked for %d refreshes in all, want 2", n)
	}
	// The dead owner's record lapses: nobody owns until the next read.
	own.Set(owner.View{})
	if f.Yield() {
		t.Fatal("Yield = true with nobody owning writes")
	}
	if n := own.Refreshes(); n != 3 {
		t.Fatalf("Yield with nobody owning asked for %d refreshes in all, want 3", n)
	}

	// The refresh names a live owner nothing here has dialed: Yield
	// connects to it and, once the connection is up, gives way.
	own.Set(owner.View{Epoch: 2, ID: 7, URL: serveOwner(t, nil)})
	for !f.Yield() {
		if ctx.Err() != nil {
			t.Fatal("Yield never gave way to a live owner it was not yet connected to")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
