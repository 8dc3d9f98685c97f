package commitfeed

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// Owner is the view of ownership a follower needs (owner.Elector).
type Owner interface {
	View() owner.View
	// Changed is closed at the next change of the owner; taken before
	// View so that no change falls between the two.
	Changed() <-chan struct{}
}

// FollowConfig is what a follower follows, and where to.
type FollowConfig struct {
	Owner Owner
	// Conn returns the connection to the replica at an owner's URL (the
	// one forwarded writes take), or false when there is none to make.
	Conn func(url string) (grpc.ClientConnInterface, bool)
	// Metadata goes with the stream: on a port serving many keyspaces,
	// the one to follow (forward.TenantMetadata).
	Metadata metadata.MD
	// Into is raised to every revision the owner reports.
	Into *progress.Served
	// Sink, when set, holds the events the owner sends with them (its
	// store's tail: *mvcc.Store), before Into is raised.
	Sink Sink
	// RetryMin and RetryMax bound the pause after a failed stream, which
	// doubles from one to the other while failures repeat (100 ms and
	// 10 s when zero); a change of owner ends it.
	RetryMin, RetryMax time.Duration
	Clock              clock.Clock
	Logger             *zap.Logger
}

// Sink takes the owner's committed revisions (mvcc's Hold).
type Sink interface {
	Hold(revs []mvcc.RevisionEvents, compacted int64)
}

// Follower keeps a stream open to the current owner while another replica
// owns writes.
type Follower struct {
	cfg    FollowConfig
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Follow starts a follower; Stop ends it.
func Follow(cfg FollowConfig) *Follower {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(10*time.Second, cfg.RetryMin)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Follower{cfg: cfg, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go f.run()
	return f
}

// Stop ends the stream and waits for the follower's goroutines.
func (f *Follower) Stop() {
	f.once.Do(f.cancel)
	<-f.done
}

func (f *Follower) run() {
	defer close(f.done)
	retry := f.cfg.RetryMin
	for f.ctx.Err() == nil {
		changed := f.cfg.Owner.Changed()
		v := f.cfg.Owner.View()
		if v.Held || v.URL == "" {
			// This replica owns writes, or nobody does: nothing to follow
			// until that changes.
			retry = f.cfg.RetryMin
			f.cfg.Clock.Sleep(time.Duration(1<<62), f.ctx.Done(), changed)
			continue
		}
		got, err := f.followOnce(v.URL, changed)
		if got {
			retry = f.cfg.RetryMin
		}
		select {
		case <-changed:
			retry = f.cfg.RetryMin
			continue
		default:
		}
		if f.ctx.Err() != nil {
			return
		}
		f.cfg.Logger.Debug("commit feed: the stream to the owner ended; following it again",
			zap.String("owner", v.URL), zap.Duration("after", retry), zap.Error(err))
		f.cfg.Clock.Sleep(retry, f.ctx.Done(), changed)
		retry = min(2*retry, f.cfg.RetryMax)
	}
}

// errNoConn says the owner's URL gave no connection.
var errNoConn = errors.New("commit feed: no connection to the owner")

// followOnce follows the owner at url until the stream fails, the owner
// changes or the follower stops; got says whether any revision came.
func (f *Follower) followOnce(url string, changed <-chan struct{}) (got bool, err error) {
	cc, ok := f.cfg.Conn(url)
	if !ok {
		return false, errNoConn
	}
	ctx, cancel := context.WithCancel(f.ctx)
	// Ends the stream when the owner changes; ends with it otherwise.
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case <-changed:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-watching
	}()
	sctx := ctx
	if len(f.cfg.Metadata) > 0 {
		sctx = metadata.NewOutgoingContext(ctx, f.cfg.Metadata)
	}
	if f.cfg.Sink != nil {
		got, err = f.receive(sctx, cc, true)
		if status.Code(err) != codes.Unimplemented {
			return got, err
		}
		// An owner that sends no events (an older version).
	}
	return f.receive(sctx, cc, false)
}

// receive follows one stream of the owner's feed, with events or not.
func (f *Follower) receive(ctx context.Context, cc grpc.ClientConnInterface, events bool) (got bool, err error) {
	desc, method := &serviceDesc.Streams[0], followMethod
	if events {
		desc, method = &serviceDesc.Streams[1], followEventsMethod
	}
	// WaitForReady: an owner still being connected to is waited for
	// rather than failed on, until the owner changes.
	stream, err := cc.NewStream(ctx, desc, method, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
		return false, err
	}
	if err := stream.CloseSend(); err != nil {
		return false, err
	}
	for {
		rev, err := f.recvOne(stream, events)
		if err != nil {
			return got, err
		}
		got = true
		f.cfg.Into.Observe(rev)
	}
}

// recvOne receives one message and returns its revision, having handed
// its events to the sink.
func (f *Follower) recvOne(stream grpc.ClientStream, events bool) (int64, error) {
	if !events {
		var h pb.ResponseHeader
		err := stream.RecvMsg(&h)
		return h.Revision, err
	}
	var m pb.WatchResponse
	if err := stream.RecvMsg(&m); err != nil {
		return 0, err
	}
	if len(m.Events) > 0 {
		f.cfg.Sink.Hold(byRevision(m.Events), m.CompactRevision)
	}
	return m.Header.GetRevision(), nil
}

// byRevision groups events by the revision that wrote them.
func byRevision(evs []*mvccpb.Event) []mvcc.RevisionEvents {
	var revs []mvcc.RevisionEvents
	for _, ev := range evs {
		rev := ev.Kv.GetModRevision()
		if n := len(revs); n == 0 || revs[n-1].Rev != rev {
			revs = append(revs, mvcc.RevisionEvents{Rev: rev})
		}
		revs[len(revs)-1].Events = append(revs[len(revs)-1].Events, ev)
	}
	return revs
}
