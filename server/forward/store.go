// Package forward sends the writes a replica receives to the replica that
// owns writes and lease expiry (package owner), where one sequencer
// group-commits everyone's writes instead of several replicas' batches
// conflicting on the global revision: Put, DeleteRange, writing Txns,
// Compact and LeaseRevoke (a revoke deletes its keys at a new revision).
//
// Forwarding is a performance matter, never a correctness one: the store's
// serializable transactions keep writes correct whoever commits them. So a
// replica that cannot reach the owner commits locally, and one whose view of
// the owner is stale costs a conflict, nothing more.
package forward

import (
	"context"
	"errors"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
)

// ErrOwnerLost says a forwarded write may or may not have been committed:
// the connection to the owner failed before its answer arrived. etcd says
// "leader changed" when a proposal meets the same fate, and clients treat
// both alike.
var ErrOwnerLost = errors.New("forward: the write owner went away before answering")

// forwardedKey marks a request that was forwarded once already; its receiver
// commits it itself rather than forwarding it again, so a stale view of the
// owner can cost a conflict but never a loop.
const forwardedKey = "fdb-etcd-forwarded"

// answeredKey is the trailer a receiver sets on a forwarded request it
// handles: whatever status follows is its own answer (etcd's error, or a
// failure known not to have committed), not a broken connection.
const answeredKey = "fdb-etcd-answered"

// tenantKey carries the tenant a forwarded request belongs to, for a
// receiver that serves many keyspaces on one port (package tenant). Only
// the receiver decides whether to believe it: it must come from a peer.
const tenantKey = "fdb-etcd-tenant"

// TenantMetadata is the metadata that names tenant to a peer serving many
// keyspaces on one port, for streams to the owner other than forwarded
// requests (the commit feed); nil for the empty tenant.
func TenantMetadata(tenant string) metadata.MD {
	if tenant == "" {
		return nil
	}
	return metadata.Pairs(tenantKey, tenant)
}

// Tenant returns the tenant a forwarded request names, and whether it names
// one.
func Tenant(ctx context.Context) (string, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return "", false
	}
	v := md.Get(tenantKey)
	if len(v) != 1 || v[0] == "" {
		return "", false
	}
	return v[0], true
}

// Owner is the view of ownership forwarding needs.
type Owner interface {
	View() owner.View
	// Changed is closed at the next change of the owner (owner.Elector).
	Changed() <-chan struct{}
	// Refresh asks for the owner to be looked up again now, without
	// waiting (owner.Elector).
	Refresh()
}

// Observer counts forwarded writes by outcome: "ok", "error" (the owner's
// own answer), "lost" (ErrOwnerLost), "local" (the owner was not
// connected, so this replica committed the write itself) or "yielded" (a
// write committing here gave way to an owner it could then reach, and was
// sent again, counted once more by its outcome there).
type Observer interface {
	ForwardedWrite(result string)
}

type nopObserver struct{}

func (nopObserver) ForwardedWrite(string) {}

// Forwarder routes writes to the owner.
type Forwarder struct {
	owner  Owner
	peers  *Peers
	obs    Observer
	tenant string // sent with every forwarded request when not empty
	// answered is the newest revision of a write the owner answered for
	// this replica, below which this replica's serializable reads may not go.
	answered atomic.Int64
}

// New returns a forwarder; obs may be nil.
func New(own Owner, peers *Peers, obs Observer) *Forwarder {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Forwarder{owner: own, peers: peers, obs: obs}
}

// ForTenant makes f send tenant with every request it forwards, so that
// the owner, which serves many tenants on one port, runs it in that
// tenant's keyspace.
func (f *Forwarder) ForTenant(tenant string) *Forwarder {
	f.tenant = tenant
	return f
}

// target returns the owner's connection, or false to run the request here:
// it was forwarded to this replica (which then marks its answer as its
// own), this replica owns writes, nobody does, or the owner cannot be
// reached (Peers.ready).
func (f *Forwarder) target(ctx context.Context) (peer, bool) {
	if isForwarded(ctx) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(answeredKey, "1"))
		return peer{}, false
	}
	v := f.owner.View()
	if !v.Held && v.ID == 0 {
		v = f.awaitOwner(ctx)
	}
	if v.Held || v.URL == "" {
		return peer{}, false
	}
	p, ok := f.peers.ready(ctx, v.URL)
	if !ok {
		// Not reachable: nothing was sent, so committing here is safe,
		// only slower for the others. The owner may have died and another
		// taken over since this replica last looked: look again now, so
		// that the writes committing here yield to it (Yield) within one
		// retry rather than at the next periodic read.
		f.owner.Refresh()
		f.obs.ForwardedWrite("local")
	}
	return p, ok
}

// Yield reports whether a write this replica is committing itself, and
// must retry, should give way (revision.Config.Yield): another replica now
// owns writes and the connection to it is up, so the write can go there
// instead of racing that owner's stream of commits on the head revision,
// which under load it loses until its deadline. It happens when ownership
// moves while this replica commits locally (the old owner died). Called
// inside a write transaction: it never dials or waits. When nobody owns,
// or the owner it names is not connected, it asks for what would let the
// next retry yield instead: the owner looked up again (a lapsed record is
// taken over at the next read; a dead owner may have been succeeded), and
// a connection to the owner made (one that dropped stays idle until asked).
func (f *Forwarder) Yield() bool {
	v := f.owner.View()
	switch {
	case v.Held:
		return false
	case v.URL == "":
		f.owner.Refresh()
		return false
	case f.peers.isReady(v.URL):
		return true
	}
	f.owner.Refresh()
	f.peers.reconnect(v.URL)
	return false
}

// awaitOwner waits, up to connectWait, for a replica to own writes while
// nobody does: the owner's record lapsed and the takeover (within the
// election's RenewInterval) has not happened yet. A write committed here
// meanwhile would race the new owner's stream of commits on the head
// revision once it takes over, and under load lose until its deadline. It
// returns the view then, which may still name nobody. The record is looked
// up again at once: a lapsed record is taken over, or found taken over, by
// the next read.
func (f *Forwarder) awaitOwner(ctx context.Context) owner.View {
	ctx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	f.owner.Refresh()
	for {
		changed := f.owner.Changed() // before View: no change falls between
		v := f.owner.View()
		if v.Held || v.ID != 0 {
			return v
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v
		}
	}
}

// isForwarded reports whether the request in ctx was forwarded here by
// another replica.
func isForwarded(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(forwardedKey)) > 0
}

func (f *Forwarder) outgoing(ctx context.Context) context.Context {
	md := metadata.Join(metadata.Pairs(forwardedKey, "1"), TenantMetadata(f.tenant))
	return metadata.NewOutgoingContext(ctx, md)
}

// result classifies the owner's answer. An error the owner answered (its
// trailer says so, or it is one of etcd's) passes through as it is, as the
// owner would have given it to the client; a failure without an answer
// leaves the outcome unknown.
func (f *Forwarder) result(ctx context.Context, err error, trailer metadata.MD) error {
	switch {
	case err == nil:
		f.obs.ForwardedWrite("ok")
		return nil
	case ctx.Err() != nil:
		f.obs.ForwardedWrite("error")
		return ctx.Err()
	case len(trailer.Get(answeredKey)) > 0, isEtcdError(err):
		f.obs.ForwardedWrite("error")
		return err
	default:
		f.obs.ForwardedWrite("lost")
		return ErrOwnerLost
	}
}

// unary is a gRPC method of the owner's client.
type unary[Req, Resp any] func(context.Context, Req, ...grpc.CallOption) (Resp, error)

// response is an etcd response: it has a header.
type response interface {
	GetHeader() *pb.ResponseHeader
}

// forward runs r at the owner through the method remote picks, or locally.
// A local write that yielded to an owner (Yield) was not applied: it goes
// to that owner, once; a write another replica forwarded here is answered
// etcd's "leader changed" (errmap), which that replica passes on, as an
// etcd member does with a proposal cut short by a change of leader.
func forward[Req any, Resp response](f *Forwarder, ctx context.Context, r Req,
	local func(context.Context, Req) (Resp, error), remote func(peer) unary[Req, Resp]) (Resp, error) {
	p, ok := f.target(ctx)
	if !ok {
		resp, err := local(ctx, r)
		if !errors.Is(err, mvcc.ErrYielded) || ctx.Err() != nil || isForwarded(ctx) {
			return resp, err
		}
		f.obs.ForwardedWrite("yielded")
		if p, ok = f.target(ctx); !ok {
			return local(ctx, r)
		}
	}
	var trailer metadata.MD
	resp, err := remote(p)(f.outgoing(ctx), r, grpc.Trailer(&trailer))
	if err == nil {
		f.sawRevision(resp.GetHeader().GetRevision())
	}
	return resp, f.result(ctx, err, trailer)
}

func (f *Forwarder) sawRevision(rev int64) {
	for cur := f.answered.Load(); rev > cur && !f.answered.CompareAndSwap(cur, rev); cur = f.answered.Load() {
	}
}

// KV is an evaluator whose writes go to the owner; reads stay here.
type KV struct {
	mvcc.Evaluator
	f *Forwarder
}

var _ mvcc.Evaluator = (*KV)(nil)

// KV wraps the local store.
func (f *Forwarder) KV(local mvcc.Evaluator) *KV { return &KV{Evaluator: local, f: f} }

// Range reads here. A serializable Range may read a recent snapshot rather
// than the latest (mvcc), one that need not have the writes the owner
// committed for this replica a moment ago; but an etcd member answers a
// write only once it applied it, and serves serializable reads from what
// it applied. So a serializable Range that read below the newest such
// write (or found its revision in the future) reads again at the latest.
func (k *KV) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	floor := k.f.answered.Load()
	resp, err := k.Evaluator.Range(ctx, r)
	stale := err == nil && resp.GetHeader().GetRevision() < floor ||
		errors.Is(err, mvcc.ErrFutureRev) && r.Revision <= floor
	if !r.Serializable || !stale {
		return resp, err
	}
	latest := proto.CloneOf(r)
	latest.Serializable = false
	return k.Evaluator.Range(ctx, latest)
}

// Put forwards or commits a put.
func (k *KV) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	return forward(k.f, ctx, r, k.Evaluator.Put, func(p peer) unary[*pb.PutRequest, *pb.PutResponse] { return p.kv.Put })
}

// DeleteRange forwards or commits a delete.
func (k *KV) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return forward(k.f, ctx, r, k.Evaluator.DeleteRange,
		func(p peer) unary[*pb.DeleteRangeRequest, *pb.DeleteRangeResponse] { return p.kv.DeleteRange })
}

// Txn forwards a transaction that writes (by etcd's rule, mvcc.TxnReadOnly);
// read-only ones run here.
func (k *KV) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if mvcc.TxnReadOnly(r) {
		return k.Evaluator.Txn(ctx, r)
	}
	return forward(k.f, ctx, r, k.Evaluator.Txn, func(p peer) unary[*pb.TxnRequest, *pb.TxnResponse] { return p.kv.Txn })
}

// Compact forwards a compaction: it commits through the sequencer like a
// write.
func (k *KV) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	return forward(k.f, ctx, r, k.Evaluator.Compact,
		func(p peer) unary[*pb.CompactionRequest, *pb.CompactionResponse] { return p.kv.Compact })
}

// Lessor is the lessor with LeaseRevoke forwarded to the owner.
type Lessor struct {
	*lease.Lessor
	f *Forwarder
}

// Lessor wraps the local lessor.
func (f *Forwarder) Lessor(local *lease.Lessor) *Lessor { return &Lessor{Lessor: local, f: f} }

// Revoke forwards or commits a revoke and returns the revision after it.
func (l *Lessor) Revoke(ctx context.Context, id int64) (int64, error) {
	resp, err := forward(l.f, ctx, &pb.LeaseRevokeRequest{ID: id},
		func(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
			rev, err := l.Lessor.Revoke(ctx, r.ID)
			return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, err
		},
		func(p peer) unary[*pb.LeaseRevokeRequest, *pb.LeaseRevokeResponse] { return p.lease.LeaseRevoke })
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetRevision(), nil
}
