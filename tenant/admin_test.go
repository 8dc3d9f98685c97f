package tenant

import (
	"crypto/tls"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// adminClient dials the router's admin service with a certificate for cn.
func (e *env) adminClient(cn string) *AdminClient {
	e.t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{Certificates: []tls.Certificate{e.clientCert(cn)}, RootCAs: e.ca.Pool()})))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	return NewAdminClient(conn)
}

// TestAdminService: an admin Common Name reaches the admin service, which
// runs every verb on the registry; a tenant's or an unknown certificate
// gets permission denied there, and an admin's reaches no tenant.
func TestAdminService(t *testing.T) {
	e := startRouter(t, false, func(c *Config) { c.AdminCNs = []string{"ops", "oncall"} })
	ctx := ctxT(t)
	admin := e.adminClient("oncall")
	rec := must(admin.CreateTenant(ctx, "team", Quotas{Keys: 10}))(t)
	if rec.Name != "team" || rec.ID == 0 || rec.Keys != 10 {
		t.Fatalf("created %+v", rec)
	}
	if _, err := admin.CreateTenant(ctx, "team", Quotas{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := admin.CreateTenant(ctx, "neg", Quotas{Watchers: -1}); !errors.Is(err, ErrInvalidQuota) {
		t.Fatalf("negative quota: %v", err)
	}
	rps := 50.0
	if r := must(admin.SetTenantQuotas(ctx, "team", QuotaChange{RequestsPerSecond: &rps}))(t); r.Keys != 10 || r.RequestsPerSecond != 50 {
		t.Fatalf("set-quota: %+v", r)
	}
	if r := must(e.router.Registry().Get(ctx, "team"))(t); r.RequestsPerSecond != 50 {
		t.Fatalf("the registry after set-quota: %+v", r)
	}
	if l := must(e.adminClient("ops").ListTenants(ctx))(t); len(l) != 1 || l[0].Name != "team" {
		t.Fatalf("list: %+v", l)
	}
	must(e.client("team").Put(ctx, "k", "v"))(t)

	for _, cn := range []string{"team", "nobody"} {
		if _, err := e.adminClient(cn).ListTenants(ctx); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("admin service for %s: %v, want permission denied", cn, err)
		}
	}
	if _, err := e.client("ops").Get(ctx, "k"); status.Code(err) != codes.Unimplemented {
		t.Fatalf("an admin's certificate on the KV service: %v, want no such service", err)
	}
	if e.router.Running() != 1 {
		t.Fatalf("%d tenant servers running, want team's only", e.router.Running())
	}

	must(0, admin.DeleteTenant(ctx, "team"))(t)
	if _, err := admin.DescribeTenant(ctx, "team"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("describe after delete: %v", err)
	}
}

// TestMetricsLimit: the first tenants up to the limit get series of their
// own, the others are summed under _other; a tenant server's log lines
// carry its name.
func TestMetricsLimit(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	e := startRouter(t, false, func(c *Config) { c.MetricsLimit, c.Logger = 1, zap.New(core) })
	ctx := ctxT(t)
	e.create("first", "second", "third")
	must(e.client("first").Put(ctx, "k", "v"))(t)
	for _, n := range []string{"second", "third"} {
		cli := e.client(n)
		must(cli.Put(ctx, "k", "v"))(t)
		w := cli.Watch(ctx, "k", clientv3.WithCreatedNotify())
		if r := <-w; !r.Created {
			t.Fatalf("%s's watch: %v", n, r.Err())
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.router.Collector())
	fams := must(reg.Gather())(t)
	series := map[string]map[string]float64{} // family -> tenant -> value
	for _, f := range fams {
		series[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			series[f.GetName()][tenantOf(m)] += value(m)
		}
	}
	for fam, want := range map[string]map[string]float64{
		"fdb_etcd_tenant_watchers":       {"_other": 2},
		"fdb_etcd_tenant_revision":       {"first": 2},
		"fdb_etcd_tenant_requests_total": {"first": 1, "_other": 2},
	} {
		for tn, v := range want {
			if series[fam][tn] != v {
				t.Errorf("%s{tenant=%q} = %v, want %v (all: %v)", fam, tn, series[fam][tn], v, series[fam])
			}
		}
		for tn := range series[fam] {
			if tn != "first" && tn != OtherTenants {
				t.Errorf("%s has a series of its own for %q past the limit", fam, tn)
			}
		}
	}
	if s := series["fdb_etcd_tenant_db_size_bytes"]; s["first"] <= 0 || s[OtherTenants] <= 0 || len(s) != 2 {
		t.Errorf("db sizes %v", s)
	}
	if len(logs.FilterMessage("serving client traffic").FilterField(zap.String("tenant", "second")).All()) != 1 {
		t.Errorf("no log line of second's server carries its name: %v", logs.FilterMessage("serving client traffic").All())
	}
	if _, err := e.client("third").Put(ctx, "", "v"); !errors.Is(err, rpctypes.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
}

func tenantOf(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "tenant" {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}
