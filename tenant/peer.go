package tenant

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/server/commitfeed"
	"github.com/fdb-etcd/fdb-etcd/server/forward"
)

// Writes between replicas. A tenant's server forwards its writes to the
// replica that owns that tenant's writes (its own ownership record, in its
// own keyspace), so that one sequencer per tenant commits them rather than
// every replica conflicting on the tenant's head. The owner's client port
// is a router too: it recognises a peer by its certificate — the one
// replicas present to each other, as without tenancy — and runs the
// request in the tenant the request names. Anyone else's connection is a
// tenant's, named by its own certificate, and the name a request carries
// is ignored there.

// tenantTag is what a tenant's forwarded writes carry: id and name, so
// that a receiver whose name now belongs to a newer tenant refuses it.
func tenantTag(rec Record) string { return strconv.FormatUint(rec.ID, 10) + "/" + rec.Name }

func parseTenantTag(tag string) (id uint64, name string, ok bool) {
	ids, name, found := strings.Cut(tag, "/")
	id, err := strconv.ParseUint(ids, 10, 64)
	return id, name, found && err == nil && name != ""
}

// peerName is the Common Name of the certificate this replica presents to
// its peers (read afresh: the certificate may have been reloaded), or ""
// without one.
func (r *Router) peerName() string {
	if r.cfg.PeerTLS == nil {
		return ""
	}
	cfg := r.cfg.PeerTLS()
	if cfg == nil || cfg.GetClientCertificate == nil {
		return ""
	}
	cert, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || cert == nil || len(cert.Certificate) == 0 {
		return ""
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return ""
		}
	}
	return leaf.Subject.CommonName
}

// startPeers starts the server that takes peers' forwarded writes, and the
// connections this replica forwards its tenants' writes on; without
// PeerTLS or write forwarding, tenants commit their writes themselves.
func (r *Router) startPeers() {
	if r.cfg.PeerTLS == nil || !r.cfg.Server.ForwardWrites {
		return
	}
	r.peers = forward.NewPeers(r.cfg.PeerTLS, r.lg)
	r.peerSrv = grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return rpctypes.ErrGRPCPermissionDenied
	}))
	api := &peerAPI{r: r}
	pb.RegisterKVServer(r.peerSrv, api)
	pb.RegisterLeaseServer(r.peerSrv, api)
	r.peerFeed = commitfeed.Register(r.peerSrv, r.followedFeed, commitfeed.FeedConfig{})
	r.peerL = newConnListener(&net.TCPAddr{})
	r.peerDone = make(chan struct{})
	go func() {
		defer close(r.peerDone)
		_ = r.peerSrv.Serve(r.peerL)
	}()
}

// stopPeers stops what startPeers started.
func (r *Router) stopPeers() {
	if r.peerSrv == nil {
		return
	}
	r.peerFeed.Stop()
	r.peerSrv.Stop()
	_ = r.peerL.Close()
	<-r.peerDone
}

// forwardedTo returns the running server of the tenant a forwarded request
// names, counted as one more connection until release; it starts the
// server if needed. A tenant whose name now has another id was deleted:
// the request is refused.
func (r *Router) forwardedTo(ctx context.Context) (*instance, error) {
	tag, ok := forward.Tenant(ctx)
	if !ok {
		return nil, rpctypes.ErrGRPCPermissionDenied
	}
	id, name, ok := parseTenantTag(tag)
	if !ok {
		return nil, rpctypes.ErrGRPCPermissionDenied
	}
	inst := r.holdRunning(name, id)
	if inst == nil {
		var err error
		if inst, err = r.acquire(ctx, name, r.peerL.Addr(), false); errors.Is(err, ErrNotFound) {
			return nil, rpctypes.ErrGRPCPermissionDenied // deleted since
		} else if err != nil {
			return nil, err
		}
	}
	<-inst.ready
	if inst.err != nil || inst.rec.ID != id {
		r.release(inst)
		if inst.err != nil {
			return nil, inst.err
		}
		r.lg.Info("forwarded write refused: its tenant was deleted", zap.String("tenant", name),
			zap.Uint64("id", id), zap.Uint64("current-id", inst.rec.ID))
		return nil, rpctypes.ErrGRPCPermissionDenied
	}
	return inst, nil
}

// followedFeed is the commit feed's Source on the peer port: the
// watermark of the tenant a peer's stream names, whose server it holds
// running while the stream lasts.
func (r *Router) followedFeed(ctx context.Context) (commitfeed.Followed, func(), error) {
	inst, err := r.forwardedTo(ctx)
	if err != nil {
		return commitfeed.Followed{}, nil, err
	}
	return inst.srv.Followed(), func() { r.release(inst) }, nil
}

// holdRunning counts one more connection on name's running server of
// tenant id, without reading the registry (watchLive stops a deleted
// tenant's server); nil if there is none.
func (r *Router) holdRunning(name string, id uint64) *instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	inst := r.tenants[name]
	if r.closed || inst == nil || inst.stopping || inst.rec.ID != id {
		return nil
	}
	inst.conns++
	if inst.stopIdle != nil {
		inst.stopIdle()
		inst.stopIdle = nil
	}
	return inst
}

// peerAPI runs peers' forwarded KV and Lease requests in the tenant each
// names, through that tenant's own services: the request still carries the
// forwarded mark, so the tenant's server commits it rather than forwarding
// it again, and says so in the trailer.
type peerAPI struct {
	pb.UnsafeKVServer
	pb.UnsafeLeaseServer
	r *Router
}

// call runs f on the services of ctx's tenant.
func call[Resp any](a *peerAPI, ctx context.Context, f func(pb.KVServer, pb.LeaseServer) (Resp, error)) (Resp, error) {
	inst, err := a.r.forwardedTo(ctx)
	if err != nil {
		var zero Resp
		return zero, err
	}
	defer a.r.release(inst)
	release, err := inst.turns.acquire(ctx)
	if err != nil {
		var zero Resp
		return zero, err
	}
	defer release()
	kv, lease := inst.srv.KVLease()
	return f(kv, lease)
}

func (a *peerAPI) Range(ctx context.Context, req *pb.RangeRequest) (*pb.RangeResponse, error) {
	return call(a, ctx, func(kv pb.KVServer, _ pb.LeaseServer) (*pb.RangeResponse, error) { return kv.Range(ctx, req) })
}

func (a *peerAPI) RangeStream(req *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	_, err := call(a, stream.Context(), func(kv pb.KVServer, _ pb.LeaseServer) (struct{}, error) {
		return struct{}{}, kv.RangeStream(req, stream)
	})
	return err
}

func (a *peerAPI) Put(ctx context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	return call(a, ctx, func(kv pb.KVServer, _ pb.LeaseServer) (*pb.PutResponse, error) { return kv.Put(ctx, req) })
}

func (a *peerAPI) DeleteRange(ctx context.Context, req *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return call(a, ctx, func(kv pb.KVServer, _ pb.LeaseServer) (*pb.DeleteRangeResponse, error) {
		return kv.DeleteRange(ctx, req)
	})
}

func (a *peerAPI) Txn(ctx context.Context, req *pb.TxnRequest) (*pb.TxnResponse, error) {
	return call(a, ctx, func(kv pb.KVServer, _ pb.LeaseServer) (*pb.TxnResponse, error) { return kv.Txn(ctx, req) })
}

func (a *peerAPI) Compact(ctx context.Context, req *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	return call(a, ctx, func(kv pb.KVServer, _ pb.LeaseServer) (*pb.CompactionResponse, error) {
		return kv.Compact(ctx, req)
	})
}

func (a *peerAPI) LeaseGrant(ctx context.Context, req *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	return call(a, ctx, func(_ pb.KVServer, l pb.LeaseServer) (*pb.LeaseGrantResponse, error) {
		return l.LeaseGrant(ctx, req)
	})
}

func (a *peerAPI) LeaseRevoke(ctx context.Context, req *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	return call(a, ctx, func(_ pb.KVServer, l pb.LeaseServer) (*pb.LeaseRevokeResponse, error) {
		return l.LeaseRevoke(ctx, req)
	})
}

func (a *peerAPI) LeaseTimeToLive(ctx context.Context, req *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	return call(a, ctx, func(_ pb.KVServer, l pb.LeaseServer) (*pb.LeaseTimeToLiveResponse, error) {
		return l.LeaseTimeToLive(ctx, req)
	})
}

func (a *peerAPI) LeaseLeases(ctx context.Context, req *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	return call(a, ctx, func(_ pb.KVServer, l pb.LeaseServer) (*pb.LeaseLeasesResponse, error) {
		return l.LeaseLeases(ctx, req)
	})
}

func (a *peerAPI) LeaseKeepAlive(stream grpc.BidiStreamingServer[pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse]) error {
	_, err := call(a, stream.Context(), func(_ pb.KVServer, l pb.LeaseServer) (struct{}, error) {
		return struct{}{}, l.LeaseKeepAlive(stream)
	})
	return err
}
