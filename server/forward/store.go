package forward

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/metadata"
)

// ErrOwnerLost says a forwarded write may or may not have been committed:
// the owner went away after it was sent. etcd says "leader changed" when a
// proposal meets the same fate, and clients treat both alike.
var ErrOwnerLost = errors.New("forward: the write owner went away before answering")

// forwardedKey marks a request that was forwarded once already; its receiver
// commits it itself rather than forwarding it again, so a stale view of the
// owner can cost a conflict but never a loop.
const forwardedKey = "fdb-etcd-forwarded"

// Store is the KV service's store: reads and compactions run locally, writes
// go to the owner unless this replica is it (or it cannot be reached).
type Store interface {
	Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	RangeChunk(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error)
	DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error)
	Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error)
	Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error)
}

// Observer counts forwarded writes by outcome: "ok", "error" (the owner's
// own answer, an etcd error), "lost" (ErrOwnerLost) or "local" (the owner
// was not connected, so this replica committed the write itself).
type Observer interface {
	ForwardedWrite(result string)
}

type nopObserver struct{}

func (nopObserver) ForwardedWrite(string) {}

// Forwarder wraps the local store.
type Forwarder struct {
	Store
	owner *Elector
	peers *Peers
	obs   Observer
}

var _ Store = (*Forwarder)(nil)

// New wraps local; obs may be nil.
func New(local Store, owner *Elector, peers *Peers, obs Observer) *Forwarder {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Forwarder{Store: local, owner: owner, peers: peers, obs: obs}
}

// target returns the owner's KV client, or nil to commit locally.
func (f *Forwarder) target(ctx context.Context) pb.KVClient {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedKey)) > 0 {
		return nil
	}
	url := f.owner.Owner()
	if url == "" {
		return nil
	}
	kv := f.peers.ready(url)
	if kv == nil {
		// Not connected (yet, or any more): nothing was sent, so committing
		// here is safe, only slower for the others.
		f.obs.ForwardedWrite("local")
	}
	return kv
}

func outgoing(ctx context.Context) context.Context {
	return metadata.NewOutgoingContext(ctx, metadata.Pairs(forwardedKey, "1"))
}

// Put forwards or commits a put.
func (f *Forwarder) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	kv := f.target(ctx)
	if kv == nil {
		return f.Store.Put(ctx, r)
	}
	resp, err := kv.Put(outgoing(ctx), r)
	return resp, f.result(ctx, err)
}

// DeleteRange forwards or commits a delete.
func (f *Forwarder) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	kv := f.target(ctx)
	if kv == nil {
		return f.Store.DeleteRange(ctx, r)
	}
	resp, err := kv.DeleteRange(outgoing(ctx), r)
	return resp, f.result(ctx, err)
}

// Txn forwards a transaction that may write; read-only ones run here.
func (f *Forwarder) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if readOnly(r) {
		return f.Store.Txn(ctx, r)
	}
	kv := f.target(ctx)
	if kv == nil {
		return f.Store.Txn(ctx, r)
	}
	resp, err := kv.Txn(outgoing(ctx), r)
	return resp, f.result(ctx, err)
}

// result classifies the owner's answer: its etcd errors pass through as they
// are, a broken connection means the outcome is unknown.
func (f *Forwarder) result(ctx context.Context, err error) error {
	switch {
	case err == nil:
		f.obs.ForwardedWrite("ok")
		return nil
	case ctx.Err() != nil:
		f.obs.ForwardedWrite("error")
		return ctx.Err()
	case isEtcdError(err):
		f.obs.ForwardedWrite("error")
		return err
	default:
		f.obs.ForwardedWrite("lost")
		return ErrOwnerLost
	}
}

func readOnly(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if !readOnly(o.RequestTxn) {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}
