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
// With each revision goes, as far as the owner holds them in the tail of
// its revision log in memory (mvcc's ReadTail: what its own sequencer
// committed, with every previous value), the events of the revisions since
// the last message; the follower holds them in its own store's tail
// (mvcc's Hold), from which its watch hub reads them instead of reading
// them back from storage. Revisions the owner does not hold are sent as a
// revision only, and the follower's hub reads them from storage.
//
// The feed is a hint, never a guarantee: a follower that misses it still
// learns of every commit from the store, as before, and nothing is
// answered from the feed's revisions alone. Its events are the owner's
// committed revisions as its store holds them, which race-enabled builds
// check against storage on every read from a tail.
package commitfeed

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/progress"
)

// serviceName names the feed's service. Its RPCs answer an emptypb.Empty
// with a stream: Follow of pb.ResponseHeader, each with the newest
// committed revision in Revision; FollowEvents of pb.WatchResponse, each
// with that revision in Header.Revision, the events of consecutive
// revisions after the last message's (none when the owner does not hold
// them), and the owner's compaction revision in CompactRevision. A
// follower asks for FollowEvents, and for Follow from an owner without it
// (an older version, during a rolling upgrade).
const (
	serviceName        = "fdbetcd.internal.CommitFeed"
	followMethod       = "/" + serviceName + "/Follow"
	followEventsMethod = "/" + serviceName + "/FollowEvents"
)

// eventBytes bounds the events of one FollowEvents message (a revision
// larger than that goes alone).
const eventBytes = 4 << 20

// DefaultMinInterval spaces one stream's messages. A commit after a quiet
// spell is sent at once; under a stream of commits the follower gets the
// newest every 2 ms. When followers read every revision back from storage
// the interval was 10 ms, as 1 ms made their hubs read five times as often
// at 1,000 writes/s; the events the messages now carry are read from
// memory, and a message 10 ms late let FoundationDB's watch wake a
// follower's hub first, which then read the revisions from storage.
const DefaultMinInterval = 2 * time.Millisecond

// Followed is what a stream follows: the watermark it reports, and the
// tail of the revision log the events come from (nil: revisions only).
type Followed struct {
	Served *progress.Served
	Tail   Tail
}

// Tail is the owner's revision log in memory (*mvcc.Store).
type Tail interface {
	ReadTail(r mvcc.WatchRead) (mvcc.EventBatch, bool)
	Compacted() int64
}

// Source returns what a stream follows: the process's own, or, on a port
// that serves many keyspaces, that of the keyspace the stream's metadata
// names. release runs when the stream ends.
type Source func(ctx context.Context) (f Followed, release func(), err error)

// Fixed is the Source of a process with one keyspace.
func Fixed(f Followed) Source {
	return func(context.Context) (Followed, func(), error) { return f, func() {}, nil }
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
	follow(stream grpc.ServerStream, events bool) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*feedServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Follow",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(feedServer).follow(stream, false)
		},
	}, {
		StreamName:    "FollowEvents",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(feedServer).follow(stream, true)
		},
	}},
}

// follow sends the watermark's newest value whenever it rises, with the
// events since the last message if events, until the follower goes away.
func (f *Feed) follow(stream grpc.ServerStream, events bool) error {
	if err := stream.RecvMsg(new(emptypb.Empty)); err != nil {
		return err
	}
	ctx := stream.Context()
	fd, release, err := f.src(ctx)
	if err != nil {
		return err
	}
	defer release()
	w := fd.Served
	// The first message tells the follower where the owner is; what came
	// before the stream it reads from storage.
	var sent int64
	next := w.Load() + 1
	for {
		// Raised before Load: a rise after the Load closes it.
		raised := w.Raised()
		if rev := w.Load(); rev > sent {
			var msg proto.Message = &pb.ResponseHeader{Revision: rev}
			if events {
				resp := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: rev}}
				if fd.Tail != nil {
					resp.Events = heldEvents(fd.Tail, next, rev)
					resp.CompactRevision = fd.Tail.Compacted()
				}
				msg, next = resp, rev+1
			}
			if err := stream.SendMsg(msg); err != nil {
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

// heldEvents is the events of the revisions from..to that the tail holds
// with every previous value, consecutive from from, at most about
// eventBytes of them.
func heldEvents(t Tail, from, to int64) []*mvccpb.Event {
	var evs []*mvccpb.Event
	for budget := eventBytes; from <= to && budget > 0; {
		b, ok := t.ReadTail(mvcc.WatchRead{From: from, UpTo: to, PrevKV: true, MaxBytes: budget})
		if !ok {
			break
		}
		for _, re := range b.Revs {
			evs = append(evs, re.Events...)
			for _, ev := range re.Events {
				budget -= len(ev.Kv.GetKey()) + len(ev.Kv.GetValue()) + len(ev.PrevKv.GetValue())
			}
		}
		from = b.To + 1
	}
	return evs
}
