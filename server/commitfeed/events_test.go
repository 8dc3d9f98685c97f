package commitfeed_test

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/owner/ownertest"
	"github.com/fdb-etcd/fdb-etcd/progress"
	"github.com/fdb-etcd/fdb-etcd/server/commitfeed"
)

// heldTail is an owner's log tail holding the revisions of held, one put
// each, and compacted at compacted.
type heldTail struct {
	mu        sync.Mutex
	held      map[int64]bool
	compacted int64
}

func (h *heldTail) hold(revs ...int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range revs {
		h.held[r] = true
	}
}

func (h *heldTail) ReadTail(r mvcc.WatchRead) (mvcc.EventBatch, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := mvcc.EventBatch{From: r.From, To: r.From - 1}
	for rev := r.From; h.held[rev] && (r.UpTo == 0 || rev <= r.UpTo); rev++ {
		b.Revs = append(b.Revs, mvcc.RevisionEvents{Rev: rev, Events: []*mvccpb.Event{{
			Kv: &mvccpb.KeyValue{Key: fmt.Appendf(nil, "k%d", rev), ModRevision: rev, Value: []byte("v")},
		}}})
		b.To = rev
	}
	return b, b.To >= r.From
}

func (h *heldTail) Compacted() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.compacted
}

// sink records the revisions a follower held, and the follower's
// watermark when it held them.
type sink struct {
	mu        sync.Mutex
	into      *progress.Served
	revs      []int64
	compacted int64
	late      []int64 // revisions held after the watermark had reached them
}

func (s *sink) Hold(revs []mvcc.RevisionEvents, compacted int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, re := range revs {
		if string(re.Events[0].Kv.Key) != fmt.Sprintf("k%d", re.Rev) {
			panic(fmt.Sprintf("revision %d holds %v", re.Rev, re.Events))
		}
		s.revs = append(s.revs, re.Rev)
		if s.into.Load() >= re.Rev {
			s.late = append(s.late, re.Rev)
		}
	}
	s.compacted = compacted
}

func (s *sink) held() ([]int64, []int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.revs), slices.Clone(s.late), s.compacted
}

// TestFollowerHoldsTheOwnersEvents: with each revision the owner sends the
// events of the revisions since its last message that its tail holds,
// consecutive; the follower holds them before it raises its watermark.
// What the owner does not hold, or held before the stream began, is not
// sent.
func TestFollowerHoldsTheOwnersEvents(t *testing.T) {
	w := &progress.Served{}
	w.Observe(10)
	tail := &heldTail{held: map[int64]bool{}, compacted: 3}
	tail.hold(9, 10, 11, 12)
	url := feedServer(t, commitfeed.Fixed(commitfeed.Followed{Served: w, Tail: tail}))
	into := &progress.Served{}
	s := &sink{into: into}
	f := commitfeed.Follow(commitfeed.FollowConfig{
		Owner: ownertest.New(owner.View{Epoch: 1, ID: 1, URL: url}), Conn: (&conns{t: t}).conn, Into: into, Sink: s,
	})
	defer f.Stop()
	waitFor(t, "the owner's revision", func() bool { return into.Load() == 10 })
	w.Observe(12)
	waitFor(t, "revision 12", func() bool { return into.Load() == 12 })
	tail.hold(14, 15) // 13 is another writer's
	w.Observe(15)
	waitFor(t, "revision 15", func() bool { return into.Load() == 15 })
	tail.hold(16)
	w.Observe(16)
	waitFor(t, "revision 16", func() bool { return into.Load() == 16 })
	revs, late, compacted := s.held()
	if want := []int64{11, 12, 16}; !slices.Equal(revs, want) || len(late) > 0 || compacted != 3 {
		t.Fatalf("held %v (late: %v), compacted %d; want %v, none late, 3", revs, late, compacted, want)
	}
}

// TestFollowerOfAnOlderOwner: an owner without FollowEvents (an older
// version) is followed for its revisions.
func TestFollowerOfAnOlderOwner(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "fdbetcd.internal.CommitFeed",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Follow", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
			if err := stream.RecvMsg(new(emptypb.Empty)); err != nil {
				return err
			}
			if err := stream.SendMsg(&pb.ResponseHeader{Revision: 77}); err != nil {
				return err
			}
			<-stream.Context().Done()
			return nil
		}}},
	}, struct{}{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	into := &progress.Served{}
	f := commitfeed.Follow(commitfeed.FollowConfig{
		Owner: ownertest.New(owner.View{Epoch: 1, ID: 1, URL: "http://" + l.Addr().String()}),
		Conn:  (&conns{t: t}).conn, Into: into, Sink: &sink{into: into},
	})
	defer f.Stop()
	waitFor(t, "the older owner's revision", func() bool { return into.Load() == 77 })
}
