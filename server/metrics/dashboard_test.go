package metrics_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/server/metrics"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

type fakeStore struct{}

func (fakeStore) Rev(context.Context) (int64, int64, error) { return 10, 2, nil }

type fakeSizer struct{}

func (fakeSizer) Size() (int64, error) { return 1 << 20, nil }

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

// TestDashboardUsesExportedMetrics keeps deploy/grafana/fdb-etcd.json in step
// with the metrics: every fdb-etcd, etcd, gRPC, process and Go runtime metric
// a panel queries must be one the server exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	m := metrics.New(metrics.Options{ServerVersion: "3.6.16", ClusterVersion: "3.6"})
	m.SetStore(fakeStore{}, fakeSizer{})
	m.SetWatchSource(func() metrics.WatchStats { return metrics.WatchStats{} })
	m.ObserveBatch(1, 1, time.Millisecond)
	m.ObserveCompaction(time.Millisecond, 1)
	m.ObserveRetry(storage.ErrNotCommitted)
	m.ObserveFDBRetry(1020, storage.ErrNotCommitted)
	_, _ = m.UnaryServerInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Range"},
		func(context.Context, any) (any, error) { return nil, nil })
	_ = m.StreamServerInterceptor()(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/etcdserverpb.Watch/Watch", IsClientStream: true, IsServerStream: true},
		func(any, grpc.ServerStream) error { return nil })
	inner, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	db := m.WrapStorage(inner)
	_ = db.View(context.Background(), func(storage.ReadTx) error { return nil })

	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{"up": true} // Prometheus' own
	for _, mf := range mfs {
		n := mf.GetName()
		exported[n] = true
		if mf.GetType().String() == "HISTOGRAM" {
			exported[n+"_bucket"], exported[n+"_sum"], exported[n+"_count"] = true, true, true
		}
	}

	b, err := os.ReadFile("../../deploy/grafana/fdb-etcd.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`\b(?:etcd|grpc|fdb_etcd|process|go)_[a-z0-9_]+\b|\bup\b`)
	labels := regexp.MustCompile(`\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)`)
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			for _, n := range name.FindAllString(labels.ReplaceAllString(tg.Expr, ""), -1) {
				if !exported[n] {
					t.Errorf("panel %q queries %s, which fdb-etcd does not export", p.Title, n)
				}
			}
		}
	}
	if queries < 20 {
		t.Fatalf("only %d queries in the dashboard", queries)
	}
}
