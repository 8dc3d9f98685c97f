package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.uber.org/zap"

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
	return nil
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
	// The root server's member record stands for the replica in every
	// tenant's MemberList.
	router, err := tenant.NewRouter(tenant.Config{Server: sc, TLS: tr.ServerConfig(),
		AutoCreate: cfg.etcd.TenantAutoCreate, IdleTimeout: cfg.etcd.TenantIdleTimeout, Logger: lg,
		PeerTLS: tr.ClientConfig, Members: srv.Members}, db)
	if err != nil {
		srv.Stop() // it closes the store
		return nil, err
	}
	observeBackend(backend, srv)
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

// runTenantCommand is `fdb-etcd tenant create|list|describe|delete|set-quota
// [NAME]`, run against the store the storage flags name.
func runTenantCommand(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: fdb-etcd tenant create|list|describe|delete|set-quota [NAME] [storage flags]")
	}
	verb := args[0]
	c := newEtcdConfig()
	fs := flag.NewFlagSet("fdb-etcd tenant "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	storageFlags(fs, c)
	quota := fs.Int64("quota-backend-bytes", 0, "the tenant's byte quota (0: the server's --quota-backend-bytes; negative: none)")
	name, err := parseTenantArgs(fs, verb, args[1:])
	if err != nil {
		return err
	}
	db, err := openBackend(c)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return tenantVerb(ctx, tenant.NewRegistry(db), verb, name, *quota, stdout)
}

// parseTenantArgs takes NAME (before or after the flags) for every verb
// but list.
func parseTenantArgs(fs *flag.FlagSet, verb string, args []string) (string, error) {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	if (name == "") != (verb == "list") {
		return "", fmt.Errorf("usage: fdb-etcd tenant %s%s", verb, map[bool]string{true: "", false: " NAME"}[verb == "list"])
	}
	return name, nil
}

func tenantVerb(ctx context.Context, reg *tenant.Registry, verb, name string, quota int64, out io.Writer) error {
	var recs []tenant.Record
	var err error
	switch verb {
	case "create":
		var r tenant.Record
		r, err = reg.Create(ctx, name, quota)
		recs = []tenant.Record{r}
	case "describe":
		var r tenant.Record
		r, err = reg.Get(ctx, name)
		recs = []tenant.Record{r}
	case "set-quota":
		var r tenant.Record
		r, err = reg.SetQuota(ctx, name, quota)
		recs = []tenant.Record{r}
	case "delete":
		if err = reg.Delete(ctx, name); err == nil {
			fmt.Fprintf(out, "deleted %s\n", name)
		}
		return err
	case "list":
		recs, err = reg.List(ctx)
	default:
		return fmt.Errorf("tenant: unknown command %q (want create, list, describe, delete or set-quota)", verb)
	}
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tQUOTA-BACKEND-BYTES")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", r.Name, r.ID, r.QuotaBackendBytes)
	}
	return tw.Flush()
}
