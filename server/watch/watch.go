// Package watch is etcd's Watch service over the watch hub: per gRPC stream,
// one goroutine receives requests (create, cancel, progress) and one sends
// the stream's responses in order, as etcd's v3rpc/watch.go does.
package watch

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fdb-etcd/fdb-etcd/progress"
	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
	"github.com/fdb-etcd/fdb-etcd/server/metrics"
	"github.com/fdb-etcd/fdb-etcd/watchhub"
)

// Config configures the service; the zero value is usable.
type Config struct {
	// ProgressNotifyInterval is etcd's
	// --experimental-watch-progress-notify-interval: the period of progress
	// notifications for watchers created with progress_notify (default 10
	// minutes, at least 100 ms, plus up to 10% jitter per stream).
	ProgressNotifyInterval time.Duration
	// MaxMessageBytes is the server's gRPC message limit, --max-request-bytes
	// plus etcd's overhead (etcd's MaxRequestBytesWithOverhead, 2 MiB by
	// default): a fragmenting watcher's responses are split at it, as etcd
	// splits them.
	MaxMessageBytes int
	// Clock drives the progress tickers; nil is the real clock.
	Clock progress.Clock
	// Jitter returns a value in [0, n) to spread streams' progress ticks;
	// nil is math/rand.
	Jitter func(n int64) int64
	// Hub tunes the watch hub.
	Hub    watchhub.Config
	Logger *zap.Logger
	// Observer, when set, counts what the service sends.
	Observer Observer
}

// Observer receives the service's counters; *metrics.Metrics implements it.
type Observer interface {
	ProgressNotifySent(n int)
	WatchEventsSent(n int)
}

type nopObserver struct{}

func (nopObserver) ProgressNotifySent(int) {}
func (nopObserver) WatchEventsSent(int)    {}

// Server implements pb.WatchServer.
type Server struct {
	pb.UnsafeWatchServer
	src watchhub.Source
	hdr header.Filler
	cfg Config
	lg  *zap.Logger

	stopc    chan struct{}
	stopOnce sync.Once

	mu      sync.Mutex
	hub     *watchhub.Hub // guarded by mu: nil while stopped or while no stream is open
	streams int           // guarded by mu: open streams
	stopped bool          // guarded by mu
	// retired sums the counters of the hubs stopped so far, so that the
	// service's counters never go back. Guarded by mu.
	retired watchhub.Stats
}

var _ pb.WatchServer = (*Server)(nil)

// New returns the service. Its watch hub, the tail of src's revision log,
// runs only while a watch stream is open: it starts with the first stream
// and stops when the last one closes. A process nobody watches follows no
// log — on a replica of a store other processes write, following costs a
// read of the head and a storage watch per revision (docs/performance.md),
// and a process serving many tenants has most of them watched by nobody.
func New(ctx context.Context, src watchhub.Source, hdr header.Filler, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ProgressNotifyInterval <= 0 {
		cfg.ProgressNotifyInterval = progress.DefaultInterval
	}
	if cfg.ProgressNotifyInterval < progress.MinInterval {
		cfg.Logger.Warn("adjusting watch progress notify interval to minimum period",
			zap.Duration("min-watch-progress-notify-interval", progress.MinInterval))
		cfg.ProgressNotifyInterval = progress.MinInterval
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 2 << 20
	}
	if cfg.Clock == nil {
		cfg.Clock = progress.RealClock()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Hub.Logger == nil {
		cfg.Hub.Logger = cfg.Logger
	}
	return &Server{src: src, hdr: hdr, cfg: cfg, lg: cfg.Logger, stopc: make(chan struct{})}, nil
}

// running returns the hub running now; nil while none runs.
func (s *Server) running() *watchhub.Hub {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hub
}

// Ready is the readiness check: the hub has dispatched every revision the
// store had committed when it was called. With no hub running there is
// nothing to dispatch.
func (s *Server) Ready(ctx context.Context) error {
	if h := s.running(); h != nil {
		return h.WaitCaughtUp(ctx)
	}
	return nil
}

// openStream returns the hub a new stream uses, starting it if needed.
func (s *Server) openStream(ctx context.Context) (*watchhub.Hub, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, rpctypes.ErrGRPCStopped
	}
	if s.hub == nil {
		hub, err := watchhub.New(ctx, s.src, s.cfg.Hub)
		if err != nil {
			return nil, errmap.ToGRPC(err)
		}
		s.hub = hub
	}
	s.streams++
	return s.hub, nil
}

// closeStream counts a stream of hub closed; the last one stops the hub.
// Its counters join retired in the same critical section that takes it
// away, so that a scrape never sees them drop; the little it counts while
// it stops is lost.
func (s *Server) closeStream(hub *watchhub.Hub) {
	s.mu.Lock()
	s.streams--
	idle := s.streams == 0 && s.hub == hub
	if idle {
		s.hub = nil
		addCounters(&s.retired, hub.Stats())
	}
	s.mu.Unlock()
	if idle {
		hub.Stop()
	}
}

// addCounters adds the counters (not the gauges) of b to a.
func addCounters(a *watchhub.Stats, b watchhub.Stats) {
	a.ProgressFromMemory += b.ProgressFromMemory
	a.ProgressAfterRead += b.ProgressAfterRead
	a.ProgressFollowUps += b.ProgressFollowUps
	a.ReadsFromMemory += b.ReadsFromMemory
	a.ReadsFromStorage += b.ReadsFromStorage
}

// Stats reports the hub's state for the metrics scrape: with no hub
// running, no watcher and no revision, and the counters so far.
func (s *Server) Stats() metrics.WatchStats {
	s.mu.Lock()
	h, st := s.hub, s.retired
	s.mu.Unlock()
	if h != nil {
		now := h.Stats()
		addCounters(&now, st)
		st = now
	}
	return metrics.WatchStats{
		CommittedRev: st.Head, DispatchedRev: st.Rev,
		Synced: st.Synced, Unsynced: st.Unsynced, Lagging: st.Lagging,
		Streams: st.Streams, QueuedBytes: st.QueuedBytes,
		ProgressFromMemory: st.ProgressFromMemory, ProgressAfterRead: st.ProgressAfterRead, ProgressFollowUps: st.ProgressFollowUps,
		ReadsFromMemory: st.ReadsFromMemory, ReadsFromStorage: st.ReadsFromStorage,
	}
}

// Stop ends every watch stream with etcd's "server stopped" error
// (Unavailable, so clients reconnect and resume their watches elsewhere),
// refuses new ones, and stops the hub. A stream whose client does not read
// ends when gRPC closes its transport.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopc)
		s.mu.Lock()
		s.stopped = true
		h := s.hub
		s.hub = nil
		s.mu.Unlock()
		if h != nil {
			h.Stop()
		}
	})
}

// Watch serves one watch stream.
func (s *Server) Watch(gs pb.Watch_WatchServer) error {
	select {
	case <-s.stopc:
		return rpctypes.ErrGRPCStopped
	default:
	}
	ctx := gs.Context()
	hub, err := s.openStream(ctx)
	if err != nil {
		return err
	}
	defer s.closeStream(hub)
	ss := &stream{srv: s, gs: gs, st: hub.NewStream()}
	if invariants {
		ss.sent = sentEvents{}
	}
	// The receive loop gets a goroutine; the send loop runs on the
	// handler's own, which saves a goroutine (and its stack) per stream
	// against etcd's three. The receive loop ends when the handler returns,
	// since gRPC then cancels the stream.
	recvErr := make(chan error, 1)
	go func() {
		if err := ss.recvLoop(ctx); err != nil {
			recvErr <- err
		}
	}()
	err = ss.sendLoop(ctx, recvErr)
	if errors.Is(err, context.Canceled) {
		err = rpctypes.ErrGRPCWatchCanceled
	}
	ss.st.Close()
	return err
}

type stream struct {
	srv  *Server
	gs   pb.Watch_WatchServer
	st   *watchhub.Stream
	sent sentEvents // race-enabled builds only (invariants)
}

// recvLoop handles the client's requests until the client closes its side
// (nil: the stream stays open for responses) or the stream fails.
func (ss *stream) recvLoop(ctx context.Context) error {
	for {
		req, err := ss.gs.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.st.WaitControl(ctx); err != nil {
			return err
		}
		if err := ss.handle(ctx, req); err != nil {
			return errmap.ToGRPC(err)
		}
	}
}

func (ss *stream) handle(ctx context.Context, req *pb.WatchRequest) error {
	switch uv := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if uv.CreateRequest == nil {
			return nil
		}
		return ss.create(ctx, uv.CreateRequest)
	case *pb.WatchRequest_CancelRequest:
		if uv.CancelRequest == nil {
			return nil
		}
		return ss.st.Cancel(ctx, uv.CancelRequest.WatchId)
	case *pb.WatchRequest_ProgressRequest:
		if uv.ProgressRequest == nil {
			return nil
		}
		return ss.st.RequestProgress(ctx)
	default:
		// etcd ignores requests it does not know rather than ending the stream.
		ss.srv.lg.Info("invalid watch request type received in gRPC stream")
		return nil
	}
}

// create applies etcd's v3rpc normalisation of a create request and hands
// it to the hub.
func (ss *stream) create(ctx context.Context, c *pb.WatchCreateRequest) error {
	key := c.Key
	if len(key) == 0 {
		key = []byte{0} // "\x00" is the smallest key
	}
	if c.StartRevision < 0 {
		return ss.st.Reject(ctx, rpctypes.ErrCompacted.Error())
	}
	var end []byte
	switch {
	case len(c.RangeEnd) == 0:
		end = nil // a single key
	case len(c.RangeEnd) == 1 && c.RangeEnd[0] == 0:
		end = []byte{} // every key >= key
	default:
		end = c.RangeEnd
	}
	o := watchhub.Options{
		ID: c.WatchId, Key: key, End: end, StartRev: c.StartRevision,
		PrevKV: c.PrevKv, Fragment: c.Fragment, ProgressNotify: c.ProgressNotify,
	}
	for _, f := range c.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			o.NoPut = true
		case pb.WatchCreateRequest_NODELETE:
			o.NoDelete = true
		}
	}
	return ss.st.Watch(ctx, o)
}

// popBatch bounds the responses the sender takes from its queue at once;
// the buffer grows to it only on a stream that has that much queued.
const popBatch = 4096

// sendLoop sends the stream's responses in queue order and drives the
// periodic progress notifications. It returns when a send fails, the
// receive loop fails, the stream's context ends or the server stops.
func (ss *stream) sendLoop(ctx context.Context, recvErr <-chan error) error {
	cfg := ss.srv.cfg
	ticker := cfg.Clock.NewTicker(progress.Interval(cfg.ProgressNotifyInterval, cfg.Jitter))
	defer ticker.Stop()
	var periodic progress.Periodic
	tick := func() {
		if periodic.Len() > 0 {
			ss.st.WatcherProgress(periodic.Tick())
		}
	}
	buf := make([]watchhub.Response, 0, 64)
	for {
		buf = coalesce(ss.st.Pop(buf[:0], popBatch))
		if len(buf) == 0 {
			select {
			case <-ss.st.Ready():
			case <-ticker.C():
				tick()
			case <-ss.st.Done():
				return ss.interrupted(ctx, recvErr)
			case err := <-recvErr:
				return err
			case <-ctx.Done():
				return ctx.Err()
			case <-ss.srv.stopc:
				return rpctypes.ErrGRPCStopped
			}
			continue
		}
		if err := ss.sendBatch(buf, &periodic); err != nil {
			return err
		}
		select {
		case <-ticker.C():
			tick()
		default:
		}
		// A stream that always has something to send still notices the
		// end of the stream, of the server or of the receive loop.
		if err := ss.interrupted(ctx, recvErr); err != nil {
			return err
		}
	}
}

// sendBatch sends buf in order, keeping the periodic progress
// notifications in step with what the client has been told, and clears
// each response it sent.
func (ss *stream) sendBatch(buf []watchhub.Response, periodic *progress.Periodic) error {
	obs := ss.srv.cfg.Observer
	for i := range buf {
		r := &buf[i]
		ss.sent.check(r)
		switch r.Kind {
		case watchhub.KindCreated:
			if r.ProgressNotify {
				periodic.Add(r.WatchID)
			}
		case watchhub.KindCanceled:
			periodic.Remove(r.WatchID)
		case watchhub.KindEvents:
			periodic.Sent(r.WatchID)
		}
		if err := ss.send(r); err != nil {
			ss.srv.lg.Debug("failed to send watch response", zap.Error(err))
			return err
		}
		switch r.Kind {
		case watchhub.KindEvents:
			obs.WatchEventsSent(len(r.Events))
		case watchhub.KindProgress:
			obs.ProgressNotifySent(1)
		}
		buf[i] = watchhub.Response{}
	}
	return nil
}

// interrupted says, without waiting, whether the stream must end and with
// what: the server stopping (etcd's "server stopped", so clients resume
// elsewhere), the receive loop's error or the stream's context.
func (ss *stream) interrupted(ctx context.Context, recvErr <-chan error) error {
	select {
	case <-ss.srv.stopc:
		return rpctypes.ErrGRPCStopped
	case err := <-recvErr:
		return err
	case <-ctx.Done():
		return ctx.Err()
	default:
		return nil
	}
}

// send sends one response, split into fragments if the watcher asked for
// them and it is too large, exactly as etcd's sendFragments splits.
func (ss *stream) send(r *watchhub.Response) error {
	if r.Kind != watchhub.KindEvents {
		return ss.gs.Send(ss.message(r, nil, false))
	}
	limit := ss.srv.cfg.MaxMessageBytes
	evs := r.Events
	if !r.Fragment || len(evs) < 2 || ss.size(r, evs, false) < limit {
		return ss.gs.Send(ss.message(r, evs, false))
	}
	base := ss.size(r, nil, true)
	for len(evs) > 0 {
		n, size := 0, base
		for n < len(evs) {
			size += len(evs[n].Wire())
			if n > 0 && size >= limit {
				break
			}
			n++
		}
		if err := ss.gs.Send(ss.message(r, evs[:n], n < len(evs))); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

// message builds the WatchResponse. Events travel as their shared,
// encoded-once wire form in the message's unknown fields, which the proto
// encoder copies verbatim: the same bytes as the events field would encode
// to, without encoding each event once per watcher.
func (ss *stream) message(r *watchhub.Response, evs []*watchhub.Event, fragment bool) *pb.WatchResponse {
	m := &pb.WatchResponse{
		Header:          ss.srv.hdr.New(r.Rev),
		WatchId:         r.WatchID,
		Created:         r.Created,
		Canceled:        r.Canceled,
		CompactRevision: r.CompactRev,
		CancelReason:    r.CancelReason,
		Fragment:        fragment,
	}
	switch len(evs) {
	case 0:
	case 1:
		m.ProtoReflect().SetUnknown(protoreflect.RawFields(evs[0].Wire()))
	default:
		n := 0
		for _, e := range evs {
			n += len(e.Wire())
		}
		raw := make([]byte, 0, n)
		for _, e := range evs {
			raw = append(raw, e.Wire()...)
		}
		m.ProtoReflect().SetUnknown(protoreflect.RawFields(raw))
	}
	return m
}

// size is the encoded size of the response with evs, as etcd measures it.
func (ss *stream) size(r *watchhub.Response, evs []*watchhub.Event, fragment bool) int {
	n := proto.Size(ss.message(r, nil, fragment))
	for _, e := range evs {
		n += len(e.Wire())
	}
	return n
}
