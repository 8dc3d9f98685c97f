// Package server assembles fdb-etcd: the etcd gRPC services over one mvcc
// store, served with HTTP/1.1 health endpoints on the same client port, the
// way etcd serves them.
package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/soheilhy/cmux"
	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/progress"
	"github.com/fdb-etcd/fdb-etcd/server/autocompact"
	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/server/commitfeed"
	"github.com/fdb-etcd/fdb-etcd/server/forward"
	"github.com/fdb-etcd/fdb-etcd/server/header"
	"github.com/fdb-etcd/fdb-etcd/server/kv"
	"github.com/fdb-etcd/fdb-etcd/server/leasesvc"
	"github.com/fdb-etcd/fdb-etcd/server/quota"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/watch"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Config is everything the server needs; cmd/fdb-etcd fills it from flags.
type Config struct {
	Name string
	// ListenClientURLs serve gRPC and, unless ListenClientHTTPURLs are
	// given, the HTTP endpoints too (http, https, unix and unixs URLs).
	ListenClientURLs []url.URL
	// ListenClientHTTPURLs serve only the HTTP endpoints (etcd's
	// --listen-client-http-urls).
	ListenClientHTTPURLs []url.URL
	AdvertiseClientURLs  []url.URL
	MaxRequestBytes      int
	MaxTxnOps            int
	// MaxConcurrentStreams bounds the gRPC streams of one client
	// connection; 0 means etcd's default, unbounded.
	MaxConcurrentStreams uint32
	// StreamWorkers is how many handler goroutines gRPC keeps for reuse; 0
	// means defaultStreamWorkers, negative means none (a goroutine per
	// request, what a process running many servers wants: each one's
	// workers would wait there for the rare request).
	StreamWorkers int
	// LazyGRPCMetrics creates each gRPC method's series at its first call
	// instead of every method's at zero when serving starts (etcd's way,
	// so that rates exist at once): a process running many servers would
	// hold some 400 KiB of zero series for each.
	LazyGRPCMetrics bool
	// SocketOpts are etcd's --socket-reuse-port and --socket-reuse-address.
	SocketOpts transport.SocketOpts
	// CORS lists the origins the HTTP endpoints allow ("*" or empty: any),
	// and HostWhitelist the Host headers plain-HTTP requests may carry
	// ("*" or empty: any), as etcd's --cors and --host-whitelist.
	CORS          []string
	HostWhitelist []string
	// AutoCompaction is etcd's --auto-compaction-mode and
	// --auto-compaction-retention; only the owner of writes compacts.
	AutoCompaction autocompact.Config
	// GRPCKeepAliveMinTime is the shortest client ping interval allowed;
	// kube-apiserver pings every 30 s, etcd allows every 5 s.
	GRPCKeepAliveMinTime  time.Duration
	GRPCKeepAliveInterval time.Duration
	GRPCKeepAliveTimeout  time.Duration
	// ShutdownTimeout bounds the graceful drain on Stop.
	ShutdownTimeout time.Duration
	// EnablePprof serves Go's runtime profiles under /debug/pprof/ on the
	// client port (never on the metrics listeners), as etcd's
	// --enable-pprof does.
	EnablePprof bool
	Logger      *zap.Logger
	MVCC        mvcc.Config
	// Lease tunes the lessor (minimum TTL, clock, expiry ownership).
	Lease lease.Config
	// Watch configures the Watch service and its hub, including
	// --experimental-watch-progress-notify-interval.
	Watch watch.Config

	// TLS configures https:// listen URLs: etcd's --cert-file, --key-file,
	// --trusted-ca-file, --client-cert-auth, --cipher-suites and
	// --tls-min-version.
	TLS tlsconfig.Config
	// ListenMetricsURLs serve /metrics and the health endpoints
	// (--listen-metrics-urls).
	ListenMetricsURLs []url.URL
	// WarningApplyDuration: unary requests slower than this are logged at
	// warn level (--warning-apply-duration); 0 means etcd's 100 ms and a
	// negative value disables the log.
	WarningApplyDuration time.Duration
	// BuildVersion is fdb-etcd's own version, for fdb_etcd_build_info.
	BuildVersion string
	// ForwardWrites sends writes to the replica that owns them
	// (server/forward), for backends that several replicas share.
	ForwardWrites bool
	// ForwardPeers, when set, are the connections to other replicas that
	// forwarded writes take, shared with other servers in the process (the
	// tenants'); the server leaves them open on Stop. Nil: its own.
	ForwardPeers *forward.Peers
	// ForwardTenant is sent with every forwarded write (forward.Tenant):
	// the tenant whose keyspace this server serves.
	ForwardTenant string
	// Owner tunes the election of the replica that owns writes and lease
	// expiry; its URL and Logger are filled in here, and its Clock is
	// the lessor's unless set.
	Owner owner.Config
	// Quota is --quota-backend-bytes: writes that would take the store past
	// it are refused and raise the NOSPACE alarm (package quota).
	Quota quota.Config
	// Members tunes this replica's record in the member registry (its TTL
	// and clock); the server fills in its identity.
	Members cluster.RegistryConfig
	// SharedMembers, when set, lists the replicas in place of a member
	// record of this server's own: a process serving many keyspaces keeps
	// one record per replica (in its root keyspace), and each keyspace
	// lists those replicas under the ids its own servers there have
	// (derived from its cluster id and the replica's name).
	SharedMembers cluster.Members
	// DisableGRPCGateway turns off the /v3/ JSON gateway on the client port
	// (etcd's --enable-grpc-gateway=false).
	DisableGRPCGateway bool
	// GRPCOptions are added after the server's own: interceptors given
	// here run inside the metrics and request-log interceptors, so what
	// they refuse is counted and logged like any other error. Package
	// tenant adds its quotas here.
	GRPCOptions []grpc.ServerOption
}

// Defaults fills zero fields with etcd's defaults.
func (c *Config) Defaults() {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 1.5 * 1024 * 1024
	}
	if c.MaxTxnOps == 0 {
		c.MaxTxnOps = 128
	}
	if c.StreamWorkers == 0 {
		c.StreamWorkers = defaultStreamWorkers
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = math.MaxUint32
	}
	if c.GRPCKeepAliveMinTime == 0 {
		c.GRPCKeepAliveMinTime = 5 * time.Second
	}
	if c.GRPCKeepAliveInterval == 0 {
		c.GRPCKeepAliveInterval = 2 * time.Hour
	}
	if c.GRPCKeepAliveTimeout == 0 {
		c.GRPCKeepAliveTimeout = 20 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.WarningApplyDuration == 0 {
		c.WarningApplyDuration = 100 * time.Millisecond
	}
}

// defaultStreamWorkers is how many handler goroutines gRPC keeps for
// reuse unless StreamWorkers says otherwise.
const defaultStreamWorkers = 64

// grpcOverheadBytes is etcd's allowance above --max-request-bytes for the
// gRPC message limit, so oversize requests get etcd's own error rather than
// gRPC's; fragmenting watchers split their responses at the same sum.
const grpcOverheadBytes = 512 * 1024

// Server is one fdb-etcd process.
type Server struct {
	cfg    Config
	lg     *zap.Logger
	db     storage.DB
	store  *mvcc.Store
	owner  *owner.Elector
	lessor *lease.Lessor
	peers  *forward.Peers // nil without ForwardWrites or with ForwardPeers
	hdr    header.Filler
	// yield tells the store's write batches, once the forwarder exists,
	// when to give way to the owner (forward.Forwarder.Yield).
	yield *yieldToOwner
	// committed is raised to the revisions the owner's commit feed reports
	// (server/commitfeed); the watch hub's tail follows it.
	committed *progress.Served
	grpc      *grpc.Server

	members  cluster.Members // the replicas, as MemberList lists them
	kvAPI    pb.KVServer     // as registered on grpc, set by New
	leaseAPI pb.LeaseServer  // as registered on grpc, set by New

	ops *ops // TLS, metrics, readiness, shutdown hooks (ops.go)

	mu        sync.Mutex
	listeners []net.Listener
	serving   sync.WaitGroup
	stopOnce  sync.Once
}

// New builds a server on an open backend. The server owns db from here on
// and closes it on Stop; if New fails, db stays the caller's to close, and
// everything New started is stopped.
func New(cfg Config, db storage.DB) (_ *Server, err error) {
	cfg.Defaults()
	cfg.MVCC.Logger = cfg.Logger
	o, measured, err := newOps(&cfg, db)
	if err != nil {
		return nil, err
	}
	clusterID, err := loadClusterID(db)
	if err != nil {
		return nil, err
	}
	yield := &yieldToOwner{}
	if cfg.ForwardWrites {
		cfg.MVCC.Sequencer.Yield = yield.Yield
	}
	store, err := mvcc.Open(measured, cfg.MVCC)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, lg: cfg.Logger, db: db, store: store, ops: o, yield: yield}
	defer func() {
		if err != nil {
			s.abort()
		}
	}()
	s.hdr = header.Filler{ClusterID: clusterID, MemberID: memberID(clusterID, cfg.Name), Served: &progress.Served{}}
	s.committed = &progress.Served{}
	s.startOwnership()
	s.grpc = grpc.NewServer(s.grpcOptions()...)
	s.OnShutdown(commitfeed.Register(s.grpc, commitfeed.Fixed(s.Followed()), commitfeed.FeedConfig{}).Stop)
	kvStore, lessor := s.writeRoutes()
	s.startAutoCompaction(kvStore)
	if err := s.registerAPI(context.Background(), kvStore, lessor); err != nil {
		return nil, err
	}
	if err := s.startWatch(); err != nil {
		return nil, err
	}
	return s, nil
}

// abort stops what a failed New started after opening the store: every
// shutdown hook registered so far, the gRPC server's stream workers,
// ownership and the lessor, the store.
func (s *Server) abort() {
	s.runShutdownHooks()
	if s.grpc != nil {
		s.grpc.Stop()
	}
	s.stopOwnership()
	s.store.Close()
}

func (s *Server) grpcOptions() []grpc.ServerOption {
	cfg := &s.cfg
	opts := append(s.ops.grpcOptions(cfg),
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes+grpcOverheadBytes),
		grpc.MaxSendMsgSize(math.MaxInt32),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cfg.GRPCKeepAliveMinTime,
			PermitWithoutStream: false,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    cfg.GRPCKeepAliveInterval,
			Timeout: cfg.GRPCKeepAliveTimeout,
		}),
	)
	if cfg.StreamWorkers > 0 {
		// Reused handler goroutines keep the stacks a request grows into
		// (gRPC, mvcc, Pebble): a fresh goroutine per request spent a
		// tenth of the server's CPU copying its stack as it grew. When all
		// workers are busy gRPC still starts a new goroutine, so this
		// bounds nothing.
		opts = append(opts, grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)))
	}
	return append(opts, cfg.GRPCOptions...)
}

// startOwnership starts this replica's part in the election of the owner
// of writes and lease expiry, and the lessor that expires leases while this
// replica owns them. Ownership is handed over first thing on shutdown, so
// that another replica takes writes and expiry over during the drain.
func (s *Server) startOwnership() {
	oc := s.cfg.Owner
	oc.Logger = s.lg
	if oc.Clock == nil {
		oc.Clock = s.cfg.Lease.Clock // one clock drives both (tests inject one)
	}
	if s.cfg.ForwardWrites {
		if us := s.cfg.AdvertiseClientURLs; len(us) > 0 {
			oc.URL = us[0].String()
		} else if us := s.cfg.ListenClientURLs; len(us) > 0 {
			oc.URL = us[0].String()
		}
	}
	// The election's transactions are measured with the store's, unless
	// the store shares them among keyspaces (a tenant's): the measuring
	// wrapper would hide that, and a shared transaction is no one
	// keyspace's.
	var odb storage.DB = s.store.DB()
	if _, shared := s.db.(owner.SharedUpdater); shared {
		odb = s.db
	}
	s.owner = owner.Start(odb, oc)
	lc := s.cfg.Lease
	if lc.Logger == nil {
		lc.Logger = s.lg
	}
	s.lessor = lease.New(s.store, s.owner, lc)
	s.OnShutdown(s.owner.Stop)
}

// stopOwnership stops what startOwnership and writeRoutes started.
func (s *Server) stopOwnership() {
	s.lessor.Stop()
	s.owner.Stop()
	if s.peers != nil {
		s.peers.Close()
	}
}

// writeRoutes returns what the KV and Lease services write through: the
// store and the lessor themselves, or forwarders that send writes (and
// revokes, and compactions) to the owner.
func (s *Server) writeRoutes() (kv.Evaluator, leasesvc.Lessor) {
	if !s.cfg.ForwardWrites {
		return s.store, s.lessor
	}
	peers := s.cfg.ForwardPeers
	if peers == nil {
		s.peers = forward.NewPeers(s.ops.clientTLS, s.lg)
		s.OnShutdown(s.peers.Close)
		peers = s.peers
	}
	fw := forward.New(s.owner, peers, s.Metrics()).ForTenant(s.cfg.ForwardTenant)
	s.yield.to.Store(fw)
	s.followCommits(peers)
	return fw.KV(s.store), fw.Lessor(s.lessor)
}

// yieldToOwner is revision.Config.Yield for a store opened before the
// forwarder that decides it: false until the forwarder is set.
type yieldToOwner struct {
	to atomic.Pointer[forward.Forwarder]
}

func (y *yieldToOwner) Yield() bool {
	f := y.to.Load()
	return f != nil && f.Yield()
}

// followCommits follows the owner's commit feed while another replica owns
// writes, so that this replica's watch hub reads a revision as soon as the
// owner has committed it rather than when the store's notification comes.
func (s *Server) followCommits(peers *forward.Peers) {
	if s.cfg.MVCC.SoleWriter {
		return
	}
	f := commitfeed.Follow(commitfeed.FollowConfig{
		Owner: s.owner, Conn: peers.Conn, Metadata: forward.TenantMetadata(s.cfg.ForwardTenant),
		Into: s.committed, Sink: s.store, Logger: s.lg,
	})
	s.OnShutdown(f.Stop)
	s.Metrics().SetCommitFeed(s.committed.Load)
}

// startAutoCompaction runs --auto-compaction-mode/retention: every replica
// samples revisions, the owner of writes compacts, through kvStore so that
// a compaction races no ownership change.
func (s *Server) startAutoCompaction(kvStore kv.Evaluator) {
	ac := s.cfg.AutoCompaction
	if !ac.Enabled() {
		return
	}
	if ac.Clock == nil {
		ac.Clock = s.cfg.Lease.Clock
	}
	if ac.Logger == nil {
		ac.Logger = s.lg
	}
	c := autocompact.Start(ac, compactStore{s.store, kvStore}, func() bool { return s.owner.View().Held })
	s.OnShutdown(c.Stop)
}

// compactStore reads revisions from the store and compacts through the
// write route.
type compactStore struct {
	store *mvcc.Store
	kv.Evaluator
}

func (c compactStore) Rev(ctx context.Context) (int64, error) {
	rev, _, err := c.store.Rev(ctx)
	return rev, err
}

// startWatch starts the watch hub and registers the Watch service; Stop
// ends its streams (clients reconnect) before the gRPC server drains.
func (s *Server) startWatch() error {
	wc := s.cfg.Watch
	wc.MaxMessageBytes, wc.Logger, wc.Observer = s.cfg.MaxRequestBytes+grpcOverheadBytes, s.lg, s.Metrics()
	wc.Hub.Served, wc.Hub.Committed, wc.Hub.SoleWriter = s.hdr.Served, s.committed, s.cfg.MVCC.SoleWriter
	ws, err := watch.New(context.Background(), s.store, s.hdr, wc)
	if err != nil {
		return err
	}
	pb.RegisterWatchServer(s.grpc, ws)
	s.OnShutdown(ws.Stop)
	s.AddReadyCheck("watch", ws.Ready)
	s.Metrics().SetWatchSource(ws.Stats)
	return nil
}

// Header returns the identity stamped on responses.
func (s *Server) Header() header.Filler { return s.hdr }

// Followed is what this server's commit feed reports to the replicas that
// follow it: the revisions it answered with, and its store's log tail.
func (s *Server) Followed() commitfeed.Followed {
	return commitfeed.Followed{Served: s.hdr.Served, Tail: s.store}
}

func urlStrings(us []url.URL) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}

// loadClusterID returns the store's cluster id, creating it on first start.
func loadClusterID(db storage.DB) (uint64, error) {
	key := keyspace.Singleton("cluster-id")
	var id uint64
	err := db.Update(context.Background(), func(tx storage.Tx) error {
		v, err := tx.Get(key)
		if err != nil {
			return err
		}
		if len(v) == 8 {
			id = binary.BigEndian.Uint64(v)
			return nil
		}
		var b [8]byte
		if _, err := cryptoRand(b[:]); err != nil {
			return err
		}
		id = binary.BigEndian.Uint64(b[:])
		tx.Set(key, b[:])
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("load cluster id: %w", err)
	}
	return id, nil
}

func memberID(clusterID uint64, name string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], clusterID)
	h.Write(b[:])
	h.Write([]byte(name))
	return h.Sum64()
}

// Serve listens on every client URL and serves until Stop. It returns once
// all listeners are up; serving continues in the background. As in etcd,
// with --listen-client-http-urls the client URLs serve gRPC only and those
// URLs the HTTP endpoints only.
func (s *Server) Serve() error {
	split := len(s.cfg.ListenClientHTTPURLs) > 0
	for _, u := range s.cfg.ListenClientURLs {
		l, err := s.listen(u)
		if err != nil {
			return err
		}
		if split {
			s.serveClient(l, true, false)
		} else {
			s.ServeListener(l)
		}
	}
	for _, u := range s.cfg.ListenClientHTTPURLs {
		l, err := s.listen(u)
		if err != nil {
			return err
		}
		s.serveClient(l, false, true)
	}
	return s.serveMetricsURLs()
}

// ServeListener serves gRPC (HTTP/2) and, over HTTP/1.1, what etcd serves
// there: the health endpoints, /metrics (where Prometheus setups for etcd
// scrape it), the /v3/ JSON gateway and, with EnablePprof, profiles.
func (s *Server) ServeListener(l net.Listener) { s.serveClient(l, true, true) }

// serveClient serves gRPC, HTTP/1.1 or both on l, split by cmux on the
// HTTP/2 preface.
func (s *Server) serveClient(l net.Listener, grpcOn, httpOn bool) {
	s.initMetrics()
	s.mu.Lock()
	s.listeners = append(s.listeners, l)
	s.mu.Unlock()
	m := cmux.New(l)
	var hs *http.Server
	if grpcOn {
		grpcL := m.Match(cmux.HTTP2())
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			_ = s.grpc.Serve(grpcL)
		}()
	}
	if httpOn {
		httpL := m.Match(cmux.Any())
		hs = &http.Server{Handler: s.clientHTTPHandler(), ReadHeaderTimeout: 10 * time.Second}
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			_ = hs.Serve(httpL)
		}()
	}
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		if err := m.Serve(); err != nil && !errors.Is(err, net.ErrClosed) && !isClosedConn(err) {
			s.lg.Debug("client listener stopped", zap.Error(err))
		}
		if hs != nil {
			_ = hs.Close()
		}
	}()
	s.lg.Info("serving client traffic", zap.String("address", l.Addr().String()),
		zap.Bool("grpc", grpcOn), zap.Bool("http", httpOn))
}

func isClosedConn(err error) bool {
	return err != nil && (errors.Is(err, net.ErrClosed) || err.Error() == "mux: server closed")
}

// Stop drains in-flight requests (up to ShutdownTimeout), then closes the
// store and the backend.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.runShutdownHooks()
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(s.cfg.ShutdownTimeout):
			s.lg.Warn("graceful stop timed out; closing remaining streams")
			s.grpc.Stop()
			<-done
		}
		s.mu.Lock()
		for _, l := range s.listeners {
			_ = l.Close()
		}
		s.mu.Unlock()
		s.serving.Wait()
		s.stopOwnership()
		s.store.Close()
		if err := s.db.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
			s.lg.Warn("closing storage", zap.Error(err))
		}
	})
}
