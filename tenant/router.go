package tenant

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/server/commitfeed"
	"github.com/fdb-etcd/fdb-etcd/server/forward"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Defaults of Config.
const (
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultHandshakeTimeout = 10 * time.Second
	lookupTimeout           = 10 * time.Second
)

// Config configures a Router.
type Config struct {
	// Server is the template of every tenant's server. The router clears
	// its TLS and listen URLs (a tenant's server serves connections the
	// router has already accepted), keeps its write forwarding only with
	// PeerTLS, and applies the tenant's own quota.
	Server server.Config
	// TLS is the client port's configuration (tlsconfig.Reloader's
	// ServerConfig); it must require and verify client certificates, whose
	// Common Name names the tenant.
	TLS *tls.Config
	// AutoCreate creates the tenant of an unknown Common Name instead of
	// refusing the connection (--tenant-auto-create).
	AutoCreate bool
	// PeerTLS is the client configuration this replica dials its peers
	// with (tlsconfig.Reloader's ClientConfig). With Server.ForwardWrites,
	// tenants' writes go to the replica that owns that tenant's writes, and
	// a connection whose certificate has the Common Name of the one
	// PeerTLS presents is a peer's: its requests run in the tenant they
	// name. That name is therefore no tenant's. Nil: every replica commits
	// its tenants' writes itself.
	PeerTLS func() *tls.Config
	// Members lists the replicas (the process's own server's MemberList,
	// from the record each replica keeps in the root keyspace); tenants'
	// servers list them under their own member ids instead of keeping a
	// record per tenant, renewed every few seconds while it runs. Nil: each
	// tenant's server keeps its own.
	Members cluster.Members
	// Fair shares the replica's request evaluation out among tenants:
	// with Fair.Slots > 0, at most that many unary requests run at once,
	// all tenants together, and the rest wait in a queue per tenant,
	// served in deficit-round-robin order (internal/fairsched). A tenant
	// alone gets every slot. Fair.Slots 0 admits everything at once.
	Fair fairsched.Config
	// IdleTimeout is how long a tenant's server runs without connections
	// before it stops; 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a connection's TLS handshake; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// AfterFunc schedules the idle stop; nil means time.AfterFunc. It
	// returns the function that cancels the call.
	AfterFunc func(d time.Duration, f func()) (stop func() bool)
	Logger    *zap.Logger
	// AdminCNs are the Common Names of administrators
	// (--tenant-admin-cn): their connections reach the admin service
	// (admin.go) instead of a tenant.
	AdminCNs []string
	// MetricsLimit is how many tenants get series of their own
	// (--tenant-metrics-limit); 0 means DefaultMetricsLimit, negative
	// none.
	MetricsLimit int
	// Now is the clock of the request quota and the request latencies;
	// nil means time.Now.
	Now func() time.Time
}

// Router serves one client port for many tenants: it does the TLS
// handshake itself and hands each connection to the server of the tenant
// its client certificate names. A tenant's server runs while it has
// connections and IdleTimeout longer, so an idle tenant costs nothing.
type Router struct {
	cfg   Config
	db    storage.DB
	reg   *Registry
	lg    *zap.Logger
	ctx   context.Context // canceled by Close: ends handshakes and lookups
	close context.CancelFunc

	// refuse answers every RPC of a refused connection with etcd's
	// permission denied.
	refuse     *grpc.Server
	refuseL    *connListener
	refuseDone chan struct{}

	// admin serves the connections of AdminCNs (admin.go); nil without.
	admin    *adminServer
	adminCNs map[string]bool
	metrics  *Metrics
	// sched takes every tenant's unary requests in turns (Config.Fair);
	// nil without.
	sched *fairsched.Scheduler
	// shared runs the running tenants' ownership renewals in shared
	// transactions (shared.go).
	shared *sharedUpdates
	// process beats for every tenant whose writes this process owns, in
	// place of a renewal per tenant (owner.Process).
	process *owner.Process

	conns sync.WaitGroup // accept loops and connections being routed

	// Forwarded writes (peer.go); nil without PeerTLS and ForwardWrites.
	peers    *forward.Peers   // tenants' servers forward through these
	peerSrv  *grpc.Server     // serves peers' forwarded requests
	peerFeed *commitfeed.Feed // the commit feed on peerSrv
	peerL    *connListener
	peerDone chan struct{}

	mu        sync.Mutex
	closed    bool                 // guarded by mu
	listeners []net.Listener       // guarded by mu
	tenants   map[string]*instance // guarded by mu
}

// instance is one tenant's running server.
type instance struct {
	rec   Record
	ready chan struct{} // closed once srv or err is set
	srv   *server.Server
	l     *connListener
	err   error

	turns turns // its turns on the process's scheduler

	conns    int           // guarded by Router.mu: connections handed to srv and open
	stopIdle func() bool   // guarded by Router.mu: cancels the pending idle stop
	stopping bool          // guarded by Router.mu: srv is stopping or stopped
	stopped  chan struct{} // closed once srv has stopped (or never started)

	unwatch   context.CancelFunc // ends watchLive
	watchDone chan struct{}      // closed when watchLive returns

	guard *guard // the tenant's quotas and metrics; set before ready closes
}

// NewRouter returns a router over the shared store db; it serves once
// Serve is given a listener.
func NewRouter(cfg Config, db storage.DB) (*Router, error) {
	if cfg.TLS == nil {
		return nil, errors.New("tenancy by client certificate needs TLS with client certificates (--client-cert-auth)")
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MetricsLimit == 0 {
		cfg.MetricsLimit = DefaultMetricsLimit
	}
	tlsCfg := cfg.TLS.Clone()
	tlsCfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.TLS = tlsCfg
	ctx, cancel := context.WithCancel(context.Background())
	r := &Router{cfg: cfg, db: db, reg: NewRegistry(db), lg: cfg.Logger, ctx: ctx, close: cancel,
		tenants: make(map[string]*instance), refuseDone: make(chan struct{}),
		metrics: newMetrics(cfg.MetricsLimit), adminCNs: make(map[string]bool), shared: newSharedUpdates(db)}
	if cfg.Fair.Slots > 0 {
		r.sched = fairsched.New(cfg.Fair)
	}
	r.process = owner.StartProcess(db, r.ownerConfig())
	for _, cn := range cfg.AdminCNs {
		r.adminCNs[cn] = true
	}
	if len(r.adminCNs) > 0 {
		r.admin = startAdminServer(r.reg.Admin())
	}
	r.refuse = grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return rpctypes.ErrGRPCPermissionDenied
	}))
	r.refuseL = newConnListener(&net.TCPAddr{})
	go func() {
		defer close(r.refuseDone)
		_ = r.refuse.Serve(r.refuseL)
	}()
	r.startPeers()
	return r, nil
}

// ownerConfig is the election settings of the tenants' servers, with the
// clock their servers give their elections.
func (r *Router) ownerConfig() owner.Config {
	oc := r.cfg.Server.Owner
	oc.Logger = r.lg
	if oc.Clock == nil {
		oc.Clock = r.cfg.Server.Lease.Clock
	}
	return oc
}

// Registry is the registry the router looks tenants up in.
func (r *Router) Registry() *Registry { return r.reg }

// Serve accepts connections on l until Close.
func (r *Router) Serve(l net.Listener) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return storage.ErrClosed
	}
	r.listeners = append(r.listeners, l)
	r.conns.Add(1)
	go r.accept(l)
	r.lg.Info("serving tenants", zap.String("address", l.Addr().String()))
	return nil
}

func (r *Router) accept(l net.Listener) {
	defer r.conns.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			if r.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				r.lg.Warn("tenant listener stopped", zap.Error(err))
			}
			return
		}
		r.conns.Add(1)
		go r.route(c)
	}
}

// route does c's TLS handshake and hands it to its tenant's server, or to
// the refusal server.
func (r *Router) route(c net.Conn) {
	defer r.conns.Done()
	tc := tls.Server(c, r.cfg.TLS)
	hctx, cancel := context.WithTimeout(r.ctx, r.cfg.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		r.lg.Debug("tenant connection: TLS handshake failed", zap.Error(err))
		_ = c.Close()
		return
	}
	name := commonName(tc.ConnectionState())
	if r.adminCNs[name] {
		r.lg.Debug("admin connection", zap.String("cn", name))
		r.admin.l.deliver(tc)
		return
	}
	if r.peerSrv != nil && name != "" && name == r.peerName() {
		r.peerL.deliver(tc)
		return
	}
	lctx, cancelLookup := context.WithTimeout(r.ctx, lookupTimeout)
	defer cancelLookup()
	inst, err := r.acquire(lctx, name, c.LocalAddr(), r.cfg.AutoCreate)
	if err != nil {
		r.lg.Info("tenant connection refused", zap.String("tenant", name), zap.Error(err))
		r.refuseL.deliver(tc)
		return
	}
	inst.l.deliver(&trackedConn{Conn: tc, onClose: func() { r.release(inst) }})
}

func commonName(st tls.ConnectionState) string {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return ""
	}
	return st.VerifiedChains[0][0].Subject.CommonName
}

// lookup returns name's record, creating it if create.
func (r *Router) lookup(ctx context.Context, name string, create bool) (Record, error) {
	if name == "" {
		return Record{}, errors.New("client certificate has no Common Name")
	}
	rec, err := r.reg.Get(ctx, name)
	if !errors.Is(err, ErrNotFound) || !create {
		return rec, err
	}
	rec, err = r.reg.Create(ctx, name, 0)
	if errors.Is(err, ErrExists) { // created by another connection meanwhile
		return r.reg.Get(ctx, name)
	}
	if err == nil {
		r.lg.Info("tenant created", zap.String("tenant", name), zap.Uint64("id", rec.ID))
	}
	return rec, err
}
