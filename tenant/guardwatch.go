package tenant

import (
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

const watchMethod = "/etcdserverpb.Watch/Watch"

// watchStream counts a Watch stream's watches against the tenant's
// watcher quota. A create over the quota never reaches the Watch service:
// the stream answers it as etcd answers a create that fails (created and
// canceled at once, with the reason), and nothing else changes. Watches
// are counted from the responses: a create passed on holds its place
// until its created response, which either opens the watch or, canceled,
// frees the place; a cancel frees the watch's place, and so does the end
// of the stream for every watch still open on it.
type watchStream struct {
	grpc.ServerStream
	g *guard

	// sendMu serializes sends: the service's own and the refusals.
	sendMu  sync.Mutex
	pending int64              // guarded by sendMu: creates passed on, not yet answered
	ids     map[int64]struct{} // guarded by sendMu: the stream's open watches
}

func (s *watchStream) RecvMsg(m any) error {
	for {
		if err := s.ServerStream.RecvMsg(m); err != nil {
			return err
		}
		req, ok := m.(*pb.WatchRequest)
		if !ok || req.GetCreateRequest() == nil {
			return nil
		}
		s.sendMu.Lock()
		err := s.g.admitWatch()
		if err == nil {
			s.pending++
			s.sendMu.Unlock()
			return nil
		}
		refusal := &pb.WatchResponse{Header: s.g.hdr.New(s.g.rev.Load()), WatchId: -1,
			Created: true, Canceled: true, CancelReason: err.Error()}
		err = s.ServerStream.SendMsg(refusal)
		s.sendMu.Unlock()
		if err != nil {
			return err
		}
	}
}

func (s *watchStream) SendMsg(m any) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if r, ok := m.(*pb.WatchResponse); ok {
		s.track(r)
	}
	return s.ServerStream.SendMsg(m)
}

// track counts the watches r opens and closes.
func (s *watchStream) track(r *pb.WatchResponse) {
	s.g.sawRevision(r.GetHeader().GetRevision())
	if s.ids == nil {
		return // released: the stream has ended
	}
	switch {
	case r.Created && s.pending > 0:
		s.pending--
		if r.Canceled {
			s.g.releaseWatches(1)
		} else {
			s.ids[r.WatchId] = struct{}{}
		}
	case r.Canceled:
		if _, ok := s.ids[r.WatchId]; ok {
			delete(s.ids, r.WatchId)
			s.g.releaseWatches(1)
		}
	}
}

// release frees the places of the stream's watches once it ended.
func (s *watchStream) release() {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.g.releaseWatches(s.pending + int64(len(s.ids)))
	s.pending, s.ids = 0, nil
}
