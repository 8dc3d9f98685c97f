// Package commitfeed tells replicas of the write owner's commits as they
// happen. Replicas forward their writes to the owner (server/forward), so
// the owner learns of nearly every commit first; the others learn of it
// when FoundationDB's watch on the head key fires, 10–20 ms later on a
// small cluster. Until then a replica's watch hub has not read the
// revision: its watchers get the event late, and a progress request (a
// kube-apiserver consistent read) on one of its streams waits for a read
// of the head and for the hub instead of being answered from memory.
//
// The owner serves one stream per follower carrying the newest revision it
// has put in a response header (progress.Served: every revision in it is
// committed), at most one message per MinInterval, the newest then: bursts
// coalesce and a follower that reads slowly only makes its own stream
// skip revisions. A follower raises a watermark of its own with each
// (watchhub.Config.Committed), which wakes its hub's tail.
//
// The feed is a hint, never a guarantee: a follower that misses it still
// learns of every commit from the store, as before, and nothing is
// answered from the feed's revisions alone.
package commitfeed

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// serviceName and followMethod name the feed's one RPC: a stream of
// pb.ResponseHeader, each with the newest committed revision in Revision,
// in answer to an emptypb.Empty.
const (
	serviceName  = "fdbetcd.internal.CommitFeed"
	followMethod = "/" + serviceName + "/Follow"
)

// DefaultMinInterval spaces one stream's messages. A commit after a quiet
// spell is sent at once; under a stream of commits the follower gets the
// newest every 10 ms, so its hub reads them in batches about as large as
// FoundationDB's watch gave it (1 ms made the hubs read five times as
// often at 1,000 writes/s, and watch delivery there no faster).
const DefaultMinInterval = 10 * time.Millisecond

// Source returns the watermark a Follow stream reports: the process's own,
// or, on a port that serves many keyspaces, that of the keyspace the
// stream's metadata names. release runs when the stream ends.
type Source func(ctx context.Context) (w *progress.Served, release func(), err error)

// Fixed is the Source of a process with one keyspace.
func Fixed(w *progress.Served) Source {
	return func(context.Context) (*progress.Served, func(), error) { return w, func() {}, nil }
}

// FeedConfig tunes the serving side; the zero value is usable.
type FeedConfig struct {
	// MinInterval is the least time between two messages of one stream
	// (DefaultMinInterval when zero).
	MinInterval time.Duration
	Clock       clock.Clock
}

// Register serves the feed on s. Its streams last as long as their
// followers: Stop ends them, before s drains, as the watch service ends
// its streams.
func Register(s *grpc.Server, src Source, cfg FeedConfig) *Feed {
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	f := &Feed{src: src, cfg: cfg, stop: make(chan struct{})}
	s.RegisterService(&serviceDesc, f)
	return f
}

// Feed is the serving side of the feed.
type Feed struct {
	src  Source
	cfg  FeedConfig
	stop chan struct{}
	once sync.Once
}

// Stop ends every stream, now and to come; followers try again elsewhere.
func (f *Feed) Stop() { f.once.Do(func() { close(f.stop) }) }

// feedServer is what serviceDesc's handler type-checks against.
type feedServer interface {
	follow(stream grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*feedServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Follow",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(feedServer).follow(stream)
		},
	}},
}

// follow sends the watermark's newest value whenever it rises, until the
// follower goes away.
func (f *Feed) follow(stream grpc.ServerStream) error {
	if err := stream.RecvMsg(new(emptypb.Empty)); err != nil {
		return err
	}
	ctx := stream.Context()
	w, release, err := f.src(ctx)
	if err != nil {
		return err
	}
	defer release()
	var sent int64
	for {
		// Raised before Load: a rise after the Load closes it.
		raised := w.Raised()
		if rev := w.Load(); rev > sent {
			if err := stream.SendMsg(&pb.ResponseHeader{Revision: rev}); err != nil {
				return err
			}
			sent = rev
			// Let a burst of commits gather into the next message.
			f.cfg.Clock.Sleep(f.cfg.MinInterval, ctx.Done(), f.stop)
		}
		select {
		case <-raised:
		case <-ctx.Done():
			return nil
		case <-f.stop:
			return nil
		}
	}
}
