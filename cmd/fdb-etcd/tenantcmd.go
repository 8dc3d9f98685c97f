package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fdb-etcd/fdb-etcd/tenant"
)

const tenantUsage = "usage: fdb-etcd tenant create|list|describe|delete|set-quota [NAME] [--quota-* flags] [storage flags | --endpoint HOST:PORT --cert FILE --key FILE --cacert FILE]"

// adminEndpoint is a running fdb-etcd's admin service (--endpoint), and
// the administrator's certificate that reaches it.
type adminEndpoint struct {
	addr, cert, key, cacert string
}

// runTenantCommand is `fdb-etcd tenant VERB [NAME]`: against the store the
// storage flags name, or with --endpoint against a running fdb-etcd's admin
// service. Both run the same verbs (tenant.Admin).
func runTenantCommand(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(tenantUsage)
	}
	verb := args[0]
	c := newEtcdConfig()
	fs := flag.NewFlagSet("fdb-etcd tenant "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	storageFlags(fs, c)
	var q tenant.Quotas
	quotaFlags(fs, &q)
	var ep adminEndpoint
	fs.StringVar(&ep.addr, "endpoint", "", "a running fdb-etcd's client URL: run the verb on its admin service instead of on the store")
	fs.StringVar(&ep.cert, "cert", "", "with --endpoint: the administrator's client certificate (its Common Name is one of the server's --tenant-admin-cn)")
	fs.StringVar(&ep.key, "key", "", "with --endpoint: the key of --cert")
	fs.StringVar(&ep.cacert, "cacert", "", "with --endpoint: the CA that signed the server's certificate")
	name, err := parseTenantArgs(fs, verb, args[1:])
	if err != nil {
		return err
	}
	change := quotaChange(fs, q)
	if verb == "set-quota" && change == (tenant.QuotaChange{}) {
		return errors.New("fdb-etcd tenant set-quota: give the quotas to change (--quota-backend-bytes, --quota-keys, --quota-requests-per-second, --quota-request-burst, --quota-watchers)")
	}
	admin, closeAdmin, err := openAdmin(c, ep)
	if err != nil {
		return err
	}
	defer closeAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return tenantVerb(ctx, admin, verb, name, q, change, stdout)
}

// quotaFlags are the quotas of create and set-quota.
func quotaFlags(fs *flag.FlagSet, q *tenant.Quotas) {
	fs.Int64Var(&q.BackendBytes, "quota-backend-bytes", 0, "the tenant's byte quota (0: the server's --quota-backend-bytes; negative: none)")
	fs.Int64Var(&q.Keys, "quota-keys", 0, "the most keys the tenant may have (0: no limit)")
	fs.Float64Var(&q.RequestsPerSecond, "quota-requests-per-second", 0, "the tenant's requests per second on each replica (0: no limit)")
	fs.Int64Var(&q.RequestBurst, "quota-request-burst", 0, "requests the tenant may send at once above its rate (0: one second's worth)")
	fs.Int64Var(&q.Watchers, "quota-watchers", 0, "the most watches the tenant may have open on each replica (0: no limit)")
}

// quotaChange is the change the quota flags given on the command line
// make: set-quota keeps the quotas not named.
func quotaChange(fs *flag.FlagSet, q tenant.Quotas) tenant.QuotaChange {
	var c tenant.QuotaChange
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "quota-backend-bytes":
			c.BackendBytes = &q.BackendBytes
		case "quota-keys":
			c.Keys = &q.Keys
		case "quota-requests-per-second":
			c.RequestsPerSecond = &q.RequestsPerSecond
		case "quota-request-burst":
			c.RequestBurst = &q.RequestBurst
		case "quota-watchers":
			c.Watchers = &q.Watchers
		}
	})
	return c
}

// openAdmin returns the administration the flags name, and its closer.
func openAdmin(c *etcdConfig, ep adminEndpoint) (tenant.Admin, func(), error) {
	if ep.addr == "" {
		db, err := openBackend(c)
		if err != nil {
			return nil, nil, err
		}
		return tenant.NewRegistry(db).Admin(), func() { _ = db.Close() }, nil
	}
	tlsCfg, err := adminTLS(ep)
	if err != nil {
		return nil, nil, err
	}
	addr := strings.TrimPrefix(ep.addr, "https://")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return nil, nil, err
	}
	return tenant.NewAdminClient(conn), func() { _ = conn.Close() }, nil
}

func adminTLS(ep adminEndpoint) (*tls.Config, error) {
	if ep.cert == "" || ep.key == "" || ep.cacert == "" {
		return nil, errors.New("--endpoint needs --cert, --key and --cacert: the admin service takes only an administrator's certificate")
	}
	cert, err := tls.LoadX509KeyPair(ep.cert, ep.key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(ep.cacert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--cacert %s: no certificate", ep.cacert)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
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

func tenantVerb(ctx context.Context, a tenant.Admin, verb, name string, q tenant.Quotas, c tenant.QuotaChange, out io.Writer) error {
	var recs []tenant.Record
	var err error
	one := func(r tenant.Record, e error) { recs, err = []tenant.Record{r}, e }
	switch verb {
	case "create":
		one(a.CreateTenant(ctx, name, q))
	case "describe":
		one(a.DescribeTenant(ctx, name))
	case "set-quota":
		one(a.SetTenantQuotas(ctx, name, c))
	case "delete":
		if err = a.DeleteTenant(ctx, name); err == nil {
			fmt.Fprintf(out, "deleted %s\n", name)
		}
		return err
	case "list":
		recs, err = a.ListTenants(ctx)
	default:
		return fmt.Errorf("tenant: unknown command %q (want create, list, describe, delete or set-quota)", verb)
	}
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tQUOTA-BACKEND-BYTES\tQUOTA-KEYS\tQUOTA-REQUESTS-PER-SECOND\tQUOTA-REQUEST-BURST\tQUOTA-WATCHERS")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%g\t%d\t%d\n", r.Name, r.ID, r.BackendBytes, r.Keys, r.RequestsPerSecond, r.RequestBurst, r.Watchers)
	}
	return tw.Flush()
}
