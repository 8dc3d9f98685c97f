package tenant

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/server/header"
	"github.com/fdb-etcd/fdb-etcd/server/quota"
)

// The refusals of the quotas etcd has no error for. Both are gRPC's
// ResourceExhausted, the code of etcd's own "too many requests", which
// clientv3 does not retry: a client sees a request refused for a limit,
// not a fault to wait out. Neither is NOSPACE, which would tell an
// operator to compact, defragment and disarm an alarm, none of which
// frees a key or a watcher.
var (
	ErrKeyQuota     = status.Error(codes.ResourceExhausted, "etcdserver: tenant key quota exceeded")
	ErrWatcherQuota = status.Error(codes.ResourceExhausted, "etcdserver: tenant watcher quota exceeded")
)

// guard enforces a running tenant's quotas in its server's gRPC chain and
// reports its requests to the tenant metrics. The quotas come from the
// tenant's DB, which takes them from the live marker every transaction
// reads; the guard applies them to each request as it comes.
type guard struct {
	name  string
	label string // the tenant's metrics label (Metrics.label)
	db    *DB
	m     *Metrics
	reqs  *series // the tenant's request series in m
	now   func() time.Time
	// bytes is the byte quota of the tenant's server; serverBytes the
	// server's own --quota-backend-bytes, for a tenant without its own.
	bytes       *quota.Limit
	serverBytes int64
	// hdr stamps the refusals of watch creates; set before the server
	// serves its first connection.
	hdr header.Filler

	rate     bucket
	keys     keyCount
	watchers atomic.Int64 // open watches and creates passed on
	rev      atomic.Int64 // the newest revision a response carried
}

func newGuard(name, label string, db *DB, m *Metrics, now func() time.Time, serverBytes int64) *guard {
	g := &guard{name: name, label: label, db: db, m: m, reqs: m.series(label), now: now, serverBytes: serverBytes}
	g.bytes = quota.NewLimit(g.bytesOf(db.Quotas()))
	return g
}

func (g *guard) bytesOf(q Quotas) int64 {
	if q.BackendBytes != 0 {
		return q.BackendBytes
	}
	return g.serverBytes
}

// quotas returns the quotas in force and applies the byte quota.
func (g *guard) quotas() Quotas {
	q := g.db.Quotas()
	g.bytes.Set(g.bytesOf(q))
	return q
}

// options are the gRPC server options of the tenant's server.
func (g *guard) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.unary),
		grpc.ChainStreamInterceptor(g.stream),
		grpc.UnknownServiceHandler(refuseAdmin),
	}
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := g.now()
	resp, err := g.admit(ctx, req, info)
	if err == nil {
		resp, err = handler(ctx, req)
	}
	if h, ok := resp.(interface{ GetHeader() *pb.ResponseHeader }); ok && err == nil {
		g.sawRevision(h.GetHeader().GetRevision())
	}
	g.reqs.request(info.FullMethod, err, g.now().Sub(start))
	return resp, err
}

// admit checks a unary request against the request rate and, for writes
// that may create keys, the key quota.
func (g *guard) admit(ctx context.Context, req any, info *grpc.UnaryServerInfo) (any, error) {
	q := g.quotas()
	if !g.rate.take(g.now(), q.RequestsPerSecond, q.RequestBurst) {
		g.m.refused(g.label, "requests")
		return nil, rpctypes.ErrGRPCRequestTooManyRequests
	}
	if q.Keys <= 0 {
		return nil, nil
	}
	keys := putKeys(req)
	if len(keys) == 0 {
		return nil, nil
	}
	kv, ok := info.Server.(pb.KVServer)
	if !ok {
		return nil, nil
	}
	if err := g.keys.admit(ctx, kv, q.Keys, keys, g.now()); err != nil {
		if errors.Is(err, ErrKeyQuota) {
			g.m.refused(g.label, "keys")
		}
		return nil, err
	}
	return nil, nil
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != watchMethod {
		return handler(srv, ss)
	}
	ws := &watchStream{ServerStream: ss, g: g, ids: make(map[int64]struct{})}
	defer ws.release()
	return handler(srv, ws)
}

// sawRevision keeps the newest revision a response carried, the tenant's
// revision in the metrics.
func (g *guard) sawRevision(rev int64) {
	for {
		old := g.rev.Load()
		if rev <= old || g.rev.CompareAndSwap(old, rev) {
			return
		}
	}
}

// admitWatch counts one more watch, unless the quota is reached.
func (g *guard) admitWatch() error {
	q := g.quotas()
	if !g.rate.take(g.now(), q.RequestsPerSecond, q.RequestBurst) {
		g.m.refused(g.label, "requests")
		return rpctypes.ErrGRPCRequestTooManyRequests
	}
	for {
		n := g.watchers.Load()
		if q.Watchers > 0 && n >= q.Watchers {
			g.m.refused(g.label, "watchers")
			return ErrWatcherQuota
		}
		if g.watchers.CompareAndSwap(n, n+1) {
			g.m.watchersAdd(g.label, 1)
			return nil
		}
	}
}

func (g *guard) releaseWatches(n int64) {
	if n > 0 {
		g.watchers.Add(-n)
		g.m.watchersAdd(g.label, -n)
	}
}

// adminService is the gRPC service of tenant administration (admin.go).
const adminService = "fdbetcd.tenant.v1.Admin"

// etcdService reports whether a tenant's server registers service; an
// unknown method of one of them is answered as gRPC answers it.
func etcdService(service string) bool {
	switch service {
	case "etcdserverpb.KV", "etcdserverpb.Watch", "etcdserverpb.Lease",
		"etcdserverpb.Maintenance", "etcdserverpb.Cluster":
		return true
	}
	return false
}

// refuseAdmin answers calls to services a tenant's server does not have:
// the admin service with permission denied (a tenant's certificate is not
// an admin's), anything else as gRPC would without the handler.
func refuseAdmin(_ any, ss grpc.ServerStream) error {
	full, _ := grpc.MethodFromServerStream(ss)
	service, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	switch {
	case service == adminService:
		return rpctypes.ErrGRPCPermissionDenied
	case etcdService(service):
		return status.Errorf(codes.Unimplemented, "unknown method %v for service %v", method, service)
	}
	return status.Errorf(codes.Unimplemented, "unknown service %v", service)
}
