package commitfeed_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/owner/ownertest"
	"github.com/fdb-etcd/fdb-etcd/progress"
	"github.com/fdb-etcd/fdb-etcd/server/commitfeed"
)

const wait = 10 * time.Second

// feedServer serves a feed on loopback and returns its URL.
func feedServer(t *testing.T, src commitfeed.Source) string {
	url, _, _ := serveFeed(t, src)
	return url
}

func serveFeed(t *testing.T, src commitfeed.Source) (string, *grpc.Server, *commitfeed.Feed) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	f := commitfeed.Register(s, src, commitfeed.FeedConfig{})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return "http://" + l.Addr().String(), s, f
}

// conns dials owners on loopback, one connection per URL, closed at the
// end of the test.
type conns struct {
	t  *testing.T
	mu sync.Mutex
	cc map[string]*grpc.ClientConn
}

func (c *conns) conn(url string) (grpc.ClientConnInterface, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.cc[url]; ok {
		return cc, true
	}
	cc, err := grpc.NewClient("passthrough:///"+url[len("http://"):], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Error(err)
		return nil, false
	}
	c.t.Cleanup(func() { _ = cc.Close() })
	if c.cc == nil {
		c.cc = map[string]*grpc.ClientConn{}
	}
	c.cc[url] = cc
	return cc, true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFollowerFollowsTheOwner: a replica's follower raises its watermark
// to every revision the owner's watermark reaches (bursts coalesced to
// their newest), follows a new owner when ownership moves, and follows
// nobody while it owns writes itself.
func TestFollowerFollowsTheOwner(t *testing.T) {
	wa, wb := &progress.Served{}, &progress.Served{}
	a, b := feedServer(t, commitfeed.Fixed(commitfeed.Followed{Served: wa})), feedServer(t, commitfeed.Fixed(commitfeed.Followed{Served: wb}))
	own := ownertest.New(owner.View{Epoch: 1, ID: 1, URL: a})
	into := &progress.Served{}
	f := commitfeed.Follow(commitfeed.FollowConfig{Owner: own, Conn: (&conns{t: t}).conn, Into: into})
	defer f.Stop()

	wa.Observe(5)
	waitFor(t, "the owner's first revision", func() bool { return into.Load() == 5 })
	for rev := int64(6); rev <= 1000; rev++ {
		wa.Observe(rev)
	}
	waitFor(t, "the newest of a burst", func() bool { return into.Load() == 1000 })

	own.Set(owner.View{Epoch: 2, ID: 2, URL: b})
	wb.Observe(2000)
	waitFor(t, "the new owner's revision", func() bool { return into.Load() == 2000 })
	wa.Observe(3000) // the old owner is no longer followed
	wb.Observe(2001)
	waitFor(t, "the new owner's next revision", func() bool { return into.Load() == 2001 })

	own.Set(owner.View{Held: true, Epoch: 3, ID: 3, URL: "http://this"})
	own.Set(owner.View{Epoch: 4, ID: 2, URL: b})
	wb.Observe(4000)
	waitFor(t, "the owner's revision after ownership came back to it", func() bool { return into.Load() == 4000 })
}

// TestFollowerNamesItsKeyspaceAndRetries: the stream carries the follower's
// metadata to the owner's Source (the tenant on a port serving many), and
// a Source that refuses the stream is tried again until it accepts.
func TestFollowerNamesItsKeyspaceAndRetries(t *testing.T) {
	w := &progress.Served{}
	w.Observe(42)
	var mu sync.Mutex
	refusals, released := 2, 0
	url := feedServer(t, func(ctx context.Context) (commitfeed.Followed, func(), error) {
		mu.Lock()
		defer mu.Unlock()
		md, _ := metadata.FromIncomingContext(ctx)
		if got := md.Get("tenant"); len(got) != 1 || got[0] != "blue" {
			return commitfeed.Followed{}, nil, errors.New("no tenant named")
		}
		if refusals > 0 {
			refusals--
			return commitfeed.Followed{}, nil, rpctypes.ErrGRPCPermissionDenied
		}
		return commitfeed.Followed{Served: w}, func() {
			mu.Lock()
			released++
			mu.Unlock()
		}, nil
	})
	into := &progress.Served{}
	f := commitfeed.Follow(commitfeed.FollowConfig{
		Owner: ownertest.New(owner.View{Epoch: 1, ID: 1, URL: url}), Conn: (&conns{t: t}).conn,
		Metadata: metadata.Pairs("tenant", "blue"), Into: into, RetryMin: time.Millisecond,
	})
	waitFor(t, "the revision after two refusals", func() bool { return into.Load() == 42 })
	f.Stop()
	waitFor(t, "the stream's release on the owner", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return released == 1
	})
}

// TestFeedStopEndsStreams: a stopping owner ends its feed streams before
// it drains, so that followers do not hold its graceful stop open.
func TestFeedStopEndsStreams(t *testing.T) {
	w := &progress.Served{}
	w.Observe(7)
	url, s, feed := serveFeed(t, commitfeed.Fixed(commitfeed.Followed{Served: w}))
	into := &progress.Served{}
	f := commitfeed.Follow(commitfeed.FollowConfig{
		Owner: ownertest.New(owner.View{Epoch: 1, ID: 1, URL: url}), Conn: (&conns{t: t}).conn, Into: into,
	})
	defer f.Stop()
	waitFor(t, "the owner's revision", func() bool { return into.Load() == 7 })
	feed.Stop()
	drained := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(wait):
		t.Fatal("the owner's graceful stop still waits for a follower's stream")
	}
}
