package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fdb-etcd/fdb-etcd/server/metrics"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

func value(t *testing.T, m *metrics.Metrics, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range s.Label {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				return s.Counter.GetValue()
			case s.Gauge != nil:
				return s.Gauge.GetValue()
			case s.Histogram != nil:
				return float64(s.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func TestNilMetricsHooksAreNoOps(t *testing.T) {
	var m *metrics.Metrics
	m.ObserveBatch(1, 2, time.Millisecond)
	m.ObserveCompaction(time.Second, 3)
	m.ProgressNotifySent(1)
	m.WatchEventsSent(1)
	m.LeaseGranted()
	m.LeaseRevoked()
	m.LeaseRenewed()
	m.LeaseExpired(1)
	m.SetLeaseOwner(true)
	m.SetWatchSource(nil)
	m.SetStore(nil, nil)
	m.ObserveRetry(storage.ErrNotCommitted)
	m.ObserveFDBRetry(1020, storage.ErrNotCommitted)
	m.ObserveFDBCommit(time.Millisecond, nil)
	m.ObserveFDBReadVersion(time.Millisecond)
	m.ObserveFDBRecovery()
	m.InitializeGRPC(grpc.NewServer())
	db := faulty.Wrap(nil, faulty.Options{})
	if got := m.WrapStorage(db); got != storage.DB(db) {
		t.Fatal("nil metrics wrapped the storage")
	}
}

func TestHooks(t *testing.T) {
	m := metrics.New(metrics.Options{ServerVersion: "3.6.16"})
	m.ObserveBatch(7, 1000, 3*time.Millisecond)
	m.ObserveCompaction(time.Second, 5)
	m.ProgressNotifySent(2)
	m.WatchEventsSent(3)
	m.LeaseGranted()
	m.LeaseRevoked()
	m.LeaseRenewed()
	m.LeaseExpired(4)
	m.SetLeaseOwner(true)
	m.SetWatchSource(func() metrics.WatchStats {
		return metrics.WatchStats{CommittedRev: 100, DispatchedRev: 90, Synced: 5, Unsynced: 2, Lagging: 1, Streams: 3, QueuedBytes: 4096,
			ReadsFromMemory: 7, ReadsFromStorage: 2}
	})
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fdb_etcd_revision_batch_requests", nil, 1},
		{"fdb_etcd_mvcc_compaction_duration_seconds", nil, 1},
		{"fdb_etcd_mvcc_compaction_keys_total", nil, 5},
		{"fdb_etcd_watch_progress_notifications_sent_total", nil, 2},
		{"etcd_debugging_mvcc_events_total", nil, 3},
		{"etcd_debugging_lease_granted_total", nil, 1},
		{"etcd_debugging_lease_revoked_total", nil, 1},
		{"etcd_debugging_lease_renewed_total", nil, 1},
		{"etcd_debugging_server_lease_expired_total", nil, 4},
		{"fdb_etcd_lease_expired_total", nil, 4},
		{"fdb_etcd_lease_expiry_owner", nil, 1},
		{"etcd_debugging_mvcc_watcher_total", nil, 8},
		{"etcd_debugging_mvcc_slow_watcher_total", nil, 3},
		{"etcd_debugging_mvcc_watch_stream_total", nil, 3},
		{"fdb_etcd_watchers", []string{"state", "victim"}, 1},
		{"fdb_etcd_watchers", []string{"state", "synced"}, 5},
		{"fdb_etcd_watch_hub_lag_revisions", nil, 10},
		{"fdb_etcd_watch_queued_bytes", nil, 4096},
		{"fdb_etcd_watch_hub_reads_total", []string{"from", "memory"}, 7},
		{"fdb_etcd_watch_hub_reads_total", []string{"from", "storage"}, 2},
		{"etcd_server_version", []string{"server_version", "3.6.16"}, 1},
	} {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, err := m.Registry().Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestStorageWrapperCountsRetries(t *testing.T) {
	inner, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	m := metrics.New(metrics.Options{})
	fdb := faulty.Wrap(inner, faulty.Options{Seed: 1, RetryProbability: 0.5})
	db := m.WrapStorage(fdb)
	if _, ok := db.(storage.Sizer); !ok {
		t.Fatal("wrapper lost storage.Sizer")
	}
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := db.Update(ctx, func(tx storage.Tx) error {
			tx.Set([]byte{byte(i)}, []byte("v"))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	retries := value(t, m, "fdb_etcd_storage_transaction_retries_total", "kind", "update")
	if retries == 0 || retries != float64(fdb.Stats.Retries.Load()) {
		t.Fatalf("retries = %v, faulty injected %d", retries, fdb.Stats.Retries.Load())
	}
	if got := value(t, m, "fdb_etcd_storage_transaction_duration_seconds", "kind", "update", "result", "ok"); got != 20 {
		t.Fatalf("update count = %v, want 20", got)
	}
	if got := value(t, m, "fdb_etcd_storage_transaction_attempts", "kind", "update"); got != 20 {
		t.Fatalf("attempts observations = %v, want 20", got)
	}

	// A transaction function that returns a retryable error is classified
	// by the wrapper when the backend does not report reasons itself.
	n := 0
	if err := db.View(ctx, func(storage.ReadTx) error {
		if n++; n == 1 {
			return storage.ErrTransactionTooOld
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := value(t, m, "fdb_etcd_storage_transaction_too_old_total"); got != 1 {
		t.Fatalf("too_old = %v, want 1", got)
	}
	if got := value(t, m, "fdb_etcd_storage_retry_reasons_total", "reason", "too_old"); got != 1 {
		t.Fatalf("retry_reasons{too_old} = %v, want 1", got)
	}
}

// reportingDB is a backend whose retry loop reports its reasons.
type reportingDB struct {
	storage.DB
	observe func(error)
	errs    []error
}

func (r *reportingDB) SetRetryObserver(f func(error)) { r.observe = f }

func (r *reportingDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	for _, e := range r.errs {
		if err := r.DB.Update(ctx, fn); err != nil {
			return err
		}
		r.observe(e) // "the commit failed with e; run again"
	}
	return r.DB.Update(ctx, fn)
}

func TestStorageWrapperUsesBackendReasons(t *testing.T) {
	inner, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	m := metrics.New(metrics.Options{})
	db := m.WrapStorage(&reportingDB{DB: inner, errs: []error{
		storage.ErrNotCommitted, storage.ErrCommitUnknownResult, storage.ErrNotCommitted, errors.New("fdb error 1009"),
	}})
	if err := db.Update(context.Background(), func(tx storage.Tx) error { tx.Set([]byte("k"), nil); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fdb_etcd_storage_conflicts_total", nil, 2},
		{"fdb_etcd_storage_commit_unknown_results_total", nil, 1},
		{"fdb_etcd_storage_retry_reasons_total", []string{"reason", "other"}, 1},
		{"fdb_etcd_storage_transaction_retries_total", []string{"kind", "update"}, 4},
	} {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

func TestKVCountsFollowEtcd(t *testing.T) {
	m := metrics.New(metrics.Options{})
	ic := m.UnaryServerInterceptor()
	call := func(req, resp any) {
		_, _ = ic(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/X"},
			func(context.Context, any) (any, error) { return resp, nil })
	}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a")}}}
	get := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a")}}}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a")}}}
	nested := &pb.TxnRequest{Success: []*pb.RequestOp{put, del}, Failure: []*pb.RequestOp{get}}
	txn := &pb.TxnRequest{
		Success: []*pb.RequestOp{put, {Request: &pb.RequestOp_RequestTxn{RequestTxn: nested}}},
		Failure: []*pb.RequestOp{get},
	}
	call(txn, &pb.TxnResponse{Succeeded: true, Responses: []*pb.ResponseOp{
		{}, {Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: &pb.TxnResponse{Succeeded: false}}},
	}}) // put + nested failure branch (get): txn
	call(txn, &pb.TxnResponse{Succeeded: false}) // get only: not a txn
	call(&pb.PutRequest{}, &pb.PutResponse{})
	for name, want := range map[string]float64{
		"etcd_mvcc_put_total": 2, "etcd_mvcc_range_total": 2, "etcd_mvcc_delete_total": 0, "etcd_mvcc_txn_total": 1,
	} {
		if got := value(t, m, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func TestScrapeWithUnreachableStore(t *testing.T) {
	m := metrics.New(metrics.Options{ScrapeTimeout: 50 * time.Millisecond})
	m.SetStore(failingStore{}, nil)
	if got := value(t, m, "etcd_server_has_leader"); got != 0 {
		t.Fatalf("has_leader = %v with an unreachable store", got)
	}
	if got := value(t, m, "fdb_etcd_scrape_store_error"); got != 1 {
		t.Fatalf("scrape_store_error = %v", got)
	}
}

type failingStore struct{}

func (failingStore) Rev(ctx context.Context) (int64, int64, error) {
	<-ctx.Done()
	return 0, 0, ctx.Err()
}

// TestFDBClientMetrics: what storage/fdb observes of FoundationDB's client
// (it calls these methods as its Observer) lands in the fdb_etcd_fdb_*
// series, and retries it reports are classified once, not again by the
// storage wrapper.
func TestFDBClientMetrics(t *testing.T) {
	inner, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	m := metrics.New(metrics.Options{})
	db := m.WrapStorage(inner)
	conflict := fmt.Errorf("%w: fdb error 1020", storage.ErrNotCommitted)
	n := 0
	// As storage/fdb does: the retry is reported before fn runs again.
	if err := db.Update(context.Background(), func(tx storage.Tx) error {
		if n++; n == 1 {
			m.ObserveFDBRetry(1020, conflict)
			return conflict
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	m.ObserveFDBRetry(1021, fmt.Errorf("%w: fdb error 1021", storage.ErrCommitUnknownResult))
	m.ObserveFDBRetry(1037, errors.New("fdb error 1037"))
	m.ObserveFDBCommit(3*time.Millisecond, nil)
	m.ObserveFDBCommit(time.Second, errors.New("fdb error 1021"))
	m.ObserveFDBReadVersion(time.Millisecond)
	m.ObserveFDBRecovery()
	m.ObserveFDBRecovery()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fdb_etcd_fdb_transaction_retries_total", []string{"code", "1020"}, 1},
		{"fdb_etcd_fdb_transaction_retries_total", []string{"code", "1021"}, 1},
		{"fdb_etcd_fdb_transaction_retries_total", []string{"code", "1037"}, 1},
		{"fdb_etcd_storage_conflicts_total", nil, 1}, // not 2: the wrapper left it to the backend
		{"fdb_etcd_storage_commit_unknown_results_total", nil, 1},
		{"fdb_etcd_storage_retry_reasons_total", []string{"reason", "other"}, 1},
		{"fdb_etcd_fdb_commit_duration_seconds", []string{"result", "ok"}, 1},
		{"fdb_etcd_fdb_commit_duration_seconds", []string{"result", "error"}, 1},
		{"fdb_etcd_fdb_read_version_duration_seconds", nil, 1},
		{"fdb_etcd_fdb_recoveries_seen_total", nil, 2},
	} {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestHandledCodeIsWhatClientsGet serves a method through the metrics
// interceptor on a real gRPC server: the code counted for each error is the
// one the client receives. Handlers pass context errors through (as
// etcd's do) and gRPC sends them as Canceled or DeadlineExceeded; counting
// them as Unknown made every client timeout during a FoundationDB recovery
// look like a server failure.
func TestHandledCodeIsWhatClientsGet(t *testing.T) {
	m := metrics.New(metrics.Options{})
	type failure struct{ err error }
	var next atomic.Pointer[failure]
	desc := grpc.ServiceDesc{ServiceName: "test.Svc", HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{{
		MethodName: "Fail",
		Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/test.Svc/Fail"}, func(context.Context, any) (any, error) {
				return nil, next.Load().err
			})
		},
	}}}
	srv := grpc.NewServer(grpc.UnaryInterceptor(m.UnaryServerInterceptor()))
	srv.RegisterService(&desc, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("storage: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{status.Error(codes.Unavailable, "etcdserver: request timed out"), codes.Unavailable},
		{errors.New("something else"), codes.Unknown},
	} {
		next.Store(&failure{c.err})
		err := conn.Invoke(context.Background(), "/test.Svc/Fail", new(emptypb.Empty), new(emptypb.Empty))
		if got := status.Code(err); got != c.want {
			t.Fatalf("client got %v for %v, want %v", got, c.err, c.want)
		}
		if got := value(t, m, "grpc_server_handled_total", "grpc_method", "Fail", "grpc_code", c.want.String()); got != 1 {
			t.Errorf("handled_total{grpc_code=%v} = %v after the client got %v", c.want, got, c.want)
		}
	}
}
