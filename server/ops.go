package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"go.etcd.io/etcd/client/pkg/v3/transport"

	"github.com/fdb-etcd/fdb-etcd/server/alarm"
	"github.com/fdb-etcd/fdb-etcd/server/gateway"
	"github.com/fdb-etcd/fdb-etcd/server/maintenance"
	"github.com/fdb-etcd/fdb-etcd/server/metrics"
	"github.com/fdb-etcd/fdb-etcd/server/reqlog"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// ops is the production plumbing of a Server: TLS, metrics, readiness
// checks and shutdown hooks. It lives apart from the service assembly so
// that services can be added to server.go without touching it.
type ops struct {
	metrics *metrics.Metrics
	tls     *tlsconfig.Reloader // nil without --cert-file
	alarms  *alarm.Store        // set by registerAPI

	initGRPC sync.Once

	gatewayOnce sync.Once
	gateway     http.Handler // the JSON gateway's; nil when disabled, failed or not yet asked for

	mu          sync.Mutex
	readyChecks []readyCheck
	onShutdown  []func()
	stopping    bool // shutdown hooks have run: start nothing that needs one
}

type readyCheck struct {
	name  string
	check func(context.Context) error
}

// newOps builds the TLS configuration and the metrics of a server. It
// returns the storage that the data model should use: db, measured.
func newOps(cfg *Config, db storage.DB) (*ops, storage.DB, error) {
	o := &ops{}
	if cfg.TLS.Enabled() {
		if cfg.TLS.Logger == nil {
			cfg.TLS.Logger = cfg.Logger
		}
		r, err := tlsconfig.New(cfg.TLS)
		if err != nil {
			return nil, nil, err
		}
		o.tls = r
	} else if err := cfg.TLS.Validate(); err != nil {
		return nil, nil, err
	}
	for _, u := range append(append(append([]url.URL{}, cfg.ListenClientURLs...), cfg.ListenClientHTTPURLs...), cfg.ListenMetricsURLs...) {
		if (u.Scheme == "https" || u.Scheme == "unixs") && o.tls == nil {
			return nil, nil, fmt.Errorf("listen URL %s is https but no --cert-file/--key-file is given", u.String())
		}
	}
	o.metrics = metrics.New(metrics.Options{
		ServerVersion:  maintenance.Version,
		ClusterVersion: clusterVersion(maintenance.Version),
		BuildVersion:   cfg.BuildVersion,
	})
	measured := o.metrics.WrapStorage(db)
	if observe := cfg.MVCC.Sequencer.Observe; observe != nil {
		cfg.MVCC.Sequencer.Observe = func(n, bytes int, took time.Duration) {
			observe(n, bytes, took)
			o.metrics.ObserveBatch(n, bytes, took)
		}
	} else {
		cfg.MVCC.Sequencer.Observe = o.metrics.ObserveBatch
	}
	if cfg.MVCC.ObserveCompaction == nil {
		cfg.MVCC.ObserveCompaction = o.metrics.ObserveCompaction
	}
	if cfg.Lease.Observer == nil {
		cfg.Lease.Observer = o.metrics
	}
	return o, measured, nil
}

// clusterVersion is etcd's major.minor cluster version.
func clusterVersion(v string) string {
	dots := 0
	for i, c := range v {
		if c == '.' {
			if dots++; dots == 2 {
				return v[:i]
			}
		}
	}
	return v
}

// grpcOptions are the interceptors every service runs behind: metrics, then
// the slow-request log.
func (o *ops) grpcOptions(cfg *Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(
			o.metrics.UnaryServerInterceptor(),
			reqlog.UnaryServerInterceptor(cfg.Logger, cfg.WarningApplyDuration),
		),
		grpc.ChainStreamInterceptor(o.metrics.StreamServerInterceptor()),
	}
}

// Metrics returns the server's metrics, whose hook methods the watch and
// lease services call (see package metrics).
func (s *Server) Metrics() *metrics.Metrics { return s.ops.metrics }

// AddReadyCheck adds a condition to /readyz (and to /health): the server is
// ready only while every check passes. The watch service adds "the hub has
// caught up with the revision log" here.
func (s *Server) AddReadyCheck(name string, check func(context.Context) error) {
	s.ops.mu.Lock()
	defer s.ops.mu.Unlock()
	s.ops.readyChecks = append(s.ops.readyChecks, readyCheck{name: name, check: check})
}

// OnShutdown registers f to run when Stop begins, before the gRPC server
// drains: the watch service ends its streams there so that clients
// reconnect to another member, as etcd's do when a member stops.
func (s *Server) OnShutdown(f func()) {
	s.ops.mu.Lock()
	defer s.ops.mu.Unlock()
	s.ops.onShutdown = append(s.ops.onShutdown, f)
}

func (s *Server) runShutdownHooks() {
	s.ops.mu.Lock()
	s.ops.stopping = true
	hooks := append([]func(){}, s.ops.onShutdown...)
	s.ops.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// checkReady runs the store check and every registered check.
func (s *Server) checkReady(ctx context.Context) error {
	if err := s.checkStore(ctx); err != nil {
		return fmt.Errorf("store unreachable: %w", err)
	}
	s.ops.mu.Lock()
	checks := append([]readyCheck{}, s.ops.readyChecks...)
	s.ops.mu.Unlock()
	for _, c := range checks {
		if err := c.check(ctx); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// initMetrics connects the scrape-time gauges to the store and pre-creates
// the gRPC series; it runs when serving starts, once every service is
// registered.
func (s *Server) initMetrics() {
	s.ops.initGRPC.Do(func() {
		var sizer metrics.SizeSource
		if sz, ok := s.db.(storage.Sizer); ok {
			sizer = sz
		}
		s.ops.metrics.SetStore(s.store, sizer)
		if !s.cfg.LazyGRPCMetrics {
			s.ops.metrics.InitializeGRPC(s.grpc)
		}
	})
}

// listen opens one listen URL as etcd does (its transport package): http
// and https on TCP with the socket options, unix and unixs on a socket file
// named by the URL's host and path (a stale one is removed first); https
// and unixs behind TLS.
func (s *Server) listen(u url.URL) (net.Listener, error) {
	addr, scheme := u.Host, "http"
	switch u.Scheme {
	case "http", "https":
	case "unix", "unixs":
		addr, scheme = u.Host+u.Path, "unix"
	default:
		return nil, fmt.Errorf("listen URL %s: scheme %q is not supported (want http, https, unix or unixs)", u.String(), u.Scheme)
	}
	opts := s.cfg.SocketOpts
	l, err := transport.NewListenerWithOpts(addr, scheme, transport.WithSocketOpts(&opts))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	if u.Scheme == "https" || u.Scheme == "unixs" {
		if s.ops.tls == nil {
			_ = l.Close()
			return nil, fmt.Errorf("listen URL %s needs a certificate (--cert-file, --key-file or --auto-tls)", u.String())
		}
		l = tls.NewListener(l, s.ops.tls.ServerConfig())
	}
	return l, nil
}

// ServeTLSListener serves the client protocols on l behind the server's TLS
// configuration (as for an https:// listen URL).
func (s *Server) ServeTLSListener(l net.Listener) error {
	if s.ops.tls == nil {
		return errors.New("server has no TLS configuration")
	}
	s.ServeListener(tls.NewListener(l, s.ops.tls.ServerConfig()))
	return nil
}

// serveMetricsURLs listens on every --listen-metrics-urls URL.
func (s *Server) serveMetricsURLs() error {
	for _, u := range s.cfg.ListenMetricsURLs {
		l, err := s.listen(u)
		if err != nil {
			return err
		}
		s.ServeMetricsListener(l)
	}
	return nil
}

// ServeMetricsListener serves /metrics and the health endpoints over
// HTTP/1.1 on l. Unlike the client port it serves no profiles and no
// gateway, as etcd's metrics listeners do not: they are plain HTTP, without
// client certificates, for scrapers and probes.
func (s *Server) ServeMetricsListener(l net.Listener) {
	s.initMetrics()
	s.mu.Lock()
	s.listeners = append(s.listeners, l)
	s.mu.Unlock()
	hs := &http.Server{Handler: s.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		if err := hs.Serve(l); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) {
			s.lg.Debug("metrics listener stopped", zap.Error(err))
		}
		_ = hs.Close()
	}()
	s.lg.Info("serving metrics", zap.String("address", l.Addr().String()))
}

// MetricsHandler serves what a metrics listener serves: /metrics and the
// health endpoints.
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.ops.metrics.Handler())
	s.handleHealth(mux)
	return mux
}

// clientHTTPHandler serves the client port's HTTP/1.1 side as etcd's does:
// /metrics, the health endpoints, the /v3/ JSON gateway and, with
// --enable-pprof, Go's profiles under /debug/pprof/ — behind the port's TLS
// and client-certificate checks when it has them.
func (s *Server) clientHTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.ops.metrics.Handler())
	s.handleHealth(mux)
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if !s.cfg.DisableGRPCGateway {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if g := s.startGateway(); g != nil {
				g.ServeHTTP(w, r)
				return
			}
			http.NotFound(w, r)
		})
		mux.Handle("/v3/", h)
		mux.Handle("/v3beta/", h)
	}
	return s.accessControl(mux)
}

// startGateway starts the JSON gateway once, on its first request: its
// in-memory connection and serving goroutine wait for JSON clients, which
// most servers never see (a process serving many keyspaces runs a server
// per keyspace). Services are all registered by then, as gRPC requires.
func (s *Server) startGateway() http.Handler {
	s.ops.gatewayOnce.Do(func() {
		s.ops.mu.Lock()
		stopping := s.ops.stopping
		s.ops.mu.Unlock()
		if stopping {
			return
		}
		g, err := gateway.Start(s.grpc, s.lg)
		if err != nil {
			s.lg.Error("JSON gateway not started", zap.Error(err))
			return
		}
		s.ops.mu.Lock()
		defer s.ops.mu.Unlock()
		if s.ops.stopping { // Stop began meanwhile: its hooks have run
			g.Close()
			return
		}
		s.ops.onShutdown = append(s.ops.onShutdown, g.Close)
		s.ops.gateway = g.Handler()
	})
	return s.ops.gateway
}

// clientTLS is the TLS configuration for dialing other replicas; nil when
// this server has no certificate.
func (o *ops) clientTLS() *tls.Config {
	if o.tls == nil {
		return nil
	}
	return o.tls.ClientConfig()
}
