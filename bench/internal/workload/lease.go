package workload

import (
	"context"
	"errors"
	"fmt"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaseKeepAlive measures keep-alive round trips: each client owns a lease
// and a LeaseKeepAlive stream and renews back to back (a request, then its
// response).
type LeaseKeepAlive struct {
	Clients int
}

func (w *LeaseKeepAlive) Group() string { return "lease" }
func (w *LeaseKeepAlive) Name() string {
	return fmt.Sprintf("lease keep-alive round trips, %d clients", w.Clients)
}

// Raw is one small write: the client's lease deadline, 8 bytes.
func (w *LeaseKeepAlive) Raw(p Params) RawSpec {
	return RawSpec{Op: RawWrite, Batchable: true, Clients: w.Clients, Prefix: "/bench/lease-keepalive/", Values: []int{8}, PerClientKey: true, P: p}
}

func (w *LeaseKeepAlive) Run(ctx context.Context, env *Env) (Result, error) {
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers:  w.Clients,
		Duration: env.P.Duration,
		MaxOps:   env.P.MaxOps,
		NewWorker: func(runCtx context.Context, _ int, c *clientv3.Client) (func(context.Context, int64) error, func(), error) {
			gctx, cancel := context.WithTimeout(runCtx, env.P.OpTimeout)
			lr, err := c.Grant(gctx, 300)
			cancel()
			if err != nil {
				return nil, nil, fmt.Errorf("grant: %w", err)
			}
			sctx, scancel := context.WithCancel(runCtx)
			stream, err := pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(sctx)
			if err != nil {
				scancel()
				return nil, nil, err
			}
			id := int64(lr.ID)
			op := func(_ context.Context, _ int64) error {
				if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
					if errors.Is(err, io.EOF) {
						// The server closed the stream; Recv has its status.
						_, err = stream.Recv()
					}
					return err
				}
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				if resp.TTL <= 0 {
					return fmt.Errorf("lease %x not renewed (ttl %d)", id, resp.TTL)
				}
				return nil
			}
			return op, scancel, nil
		},
	})
	if err != nil {
		return Result{}, err
	}
	return ResultFrom(w, r), nil
}

// LeaseGrantPut measures a lease grant followed by a put attached to it
// (one operation = both requests).
type LeaseGrantPut struct {
	Clients int
}

func (w *LeaseGrantPut) Group() string { return "lease" }
func (w *LeaseGrantPut) Name() string {
	return fmt.Sprintf("lease grant + put with lease (256B), %d clients", w.Clients)
}

// Raw is one transaction with two sets: the lease record (id and TTL, 16
// bytes) and the key.
func (w *LeaseGrantPut) Raw(p Params) RawSpec {
	return RawSpec{Op: RawWrite, Batchable: true, Clients: w.Clients, Prefix: "/bench/lease/", Values: []int{16, 256}, P: p}
}

func (w *LeaseGrantPut) Run(ctx context.Context, env *Env) (Result, error) {
	val := Value(256)
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers:  w.Clients,
		Duration: env.P.Duration,
		MaxOps:   env.P.MaxOps,
		Op: func(ctx context.Context, c *clientv3.Client, i int64) error {
			lr, err := c.Grant(ctx, 60)
			if err != nil {
				return err
			}
			_, err = c.Put(ctx, fmt.Sprintf("/bench/lease/%010d", i), val, clientv3.WithLease(lr.ID))
			return err
		},
	})
	if err != nil {
		return Result{}, err
	}
	return ResultFrom(w, r), nil
}
