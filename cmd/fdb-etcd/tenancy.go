package main

import (
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/tenant"
)

// --tenancy values.
const (
	tenancyNone         = "none"
	tenancyClientCertCN = "client-cert-cn"
)

// checkTenancy refuses tenancy settings that cannot identify tenants or
// that would be ignored.
func checkTenancy(c *etcdConfig) error {
	f := c.fdbEtcdConfig
	switch f.Tenancy {
	case tenancyNone:
		if f.TenantAutoCreate {
			return errors.New("--tenant-auto-create needs --tenancy=client-cert-cn")
		}
		if len(f.TenantAdminCNs) > 0 {
			return errors.New("--tenant-admin-cn needs --tenancy=client-cert-cn")
		}
		return nil
	case tenancyClientCertCN:
	default:
		return fmt.Errorf("--tenancy: unknown mode %q (want %s or %s)", f.Tenancy, tenancyNone, tenancyClientCertCN)
	}
	if !c.ClientTLS.CertAuth {
		return errors.New("--tenancy=client-cert-cn needs --client-cert-auth: the client certificate names the tenant")
	}
	if len(c.ListenClientHTTPURLs) > 0 {
		return errors.New("--tenancy=client-cert-cn serves no --listen-client-http-urls: a tenant's HTTP endpoints are on its client URLs")
	}
	for _, u := range c.ListenClientURLs {
		if u.Scheme != "https" && u.Scheme != "unixs" {
			return fmt.Errorf("--tenancy=client-cert-cn needs https or unixs client URLs, not %s", u.String())
		}
	}
	if f.TenantIdleTimeout <= 0 {
		return errors.New("--tenant-idle-timeout must be > 0")
	}
	if f.TenantMaxConcurrentRequests < 0 || f.TenantMaxQueuedRequests < 0 || f.TenantMaxQueueWait < 0 {
		return errors.New("--tenant-max-concurrent-requests, --tenant-max-queued-requests and --tenant-max-queue-wait must be >= 0")
	}
	if f.TenantMetricsLimit < 0 {
		return errors.New("--tenant-metrics-limit must be >= 0")
	}
	for _, cn := range f.TenantAdminCNs {
		if cn == "" {
			return errors.New("--tenant-admin-cn: an empty Common Name names no certificate")
		}
	}
	return nil
}

// appendStringsFlag is a repeatable flag whose values may be
// comma-separated lists.
type appendStringsFlag struct{ dst *[]string }

func (f appendStringsFlag) Set(s string) error {
	*f.dst = append(*f.dst, strings.Split(s, ",")...)
	return nil
}

func (f appendStringsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

// startTenancy serves every client URL through a tenant router. The
// process's own server keeps the root keyspace and serves the metrics
// URLs (health of the process and the store); it serves no client URL.
func startTenancy(cfg *config, sc server.Config, backend, db storage.DB, lg *zap.Logger) (func(), error) {
	tr, err := tlsconfig.New(sc.TLS)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	root := sc
	// Its client URLs are the router's, and writes forwarded to them are
	// tenants'; nothing writes to the root keyspace through the API anyway.
	root.ListenClientURLs, root.ForwardWrites = nil, false
	srv, err := server.New(root, db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	metricsLimit := cfg.etcd.TenantMetricsLimit
	if metricsLimit == 0 {
		metricsLimit = -1 // the flag's 0 is tenant.Config's "none"
	}
	// The root server's member record stands for the replica in every
	// tenant's MemberList.
	router, err := tenant.NewRouter(tenant.Config{Server: sc, TLS: tr.ServerConfig(),
		AutoCreate: cfg.etcd.TenantAutoCreate, IdleTimeout: cfg.etcd.TenantIdleTimeout, Logger: lg,
		AdminCNs: cfg.etcd.TenantAdminCNs, MetricsLimit: metricsLimit,
		PeerTLS: tr.ClientConfig, Members: srv.Members,
		Fair: fairsched.Config{Slots: cfg.etcd.TenantMaxConcurrentRequests,
			Queue: cfg.etcd.TenantMaxQueuedRequests, MaxWait: cfg.etcd.TenantMaxQueueWait}}, db)
	if err != nil {
		srv.Stop() // it closes the store
		return nil, err
	}
	observeBackend(backend, srv)
	if err := srv.Metrics().Registry().Register(router.Collector()); err != nil {
		router.Close()
		srv.Stop()
		return nil, err
	}
	stop := func() {
		router.Close()
		srv.Stop() // last: it closes the shared store
	}
	if err := srv.Serve(); err != nil {
		stop()
		return nil, err
	}
	for _, u := range sc.ListenClientURLs {
		addr, scheme := u.Host, "tcp"
		if u.Scheme == "unixs" {
			addr, scheme = u.Host+u.Path, "unix"
		}
		opts := sc.SocketOpts
		l, err := transport.NewListenerWithOpts(addr, scheme, transport.WithSocketOpts(&opts))
		if err == nil {
			err = router.Serve(l)
		}
		if err != nil {
			stop()
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
	}
	return stop, nil
}
