// Package errmap is the one table that turns domain errors into etcd's gRPC
// errors. Handlers never write etcd's error text themselves; clients such as
// kube-apiserver compare these errors with ==.
package errmap

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/server/forward"
)

type mapping struct {
	domain error
	grpc   error
}

// table is matched in order with errors.Is; more specific errors first.
var table = []mapping{
	{mvcc.ErrCompacted, rpctypes.ErrGRPCCompacted},
	{mvcc.ErrFutureRev, rpctypes.ErrGRPCFutureRev},
	{mvcc.ErrKeyNotFound, rpctypes.ErrGRPCKeyNotFound},
	{mvcc.ErrLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound},
	{mvcc.ErrRequestTooLarge, rpctypes.ErrGRPCRequestTooLarge},
	{mvcc.ErrStopped, rpctypes.ErrGRPCStopped},
	{mvcc.ErrTimeout, rpctypes.ErrGRPCTimeout},
	{lease.ErrLeaseExists, rpctypes.ErrGRPCLeaseExist},
	{lease.ErrLeaseTTLTooLarge, rpctypes.ErrGRPCLeaseTTLTooLarge},
	{forward.ErrOwnerLost, rpctypes.ErrGRPCLeaderChanged},
	// Handled by forwarding, which sends the write to the owner; etcd's
	// answer to a write cut short by a change of leader if it ever is not.
	{mvcc.ErrYielded, rpctypes.ErrGRPCLeaderChanged},
}

// ToGRPC maps err onto etcd's gRPC error. The table comes first: a domain
// error that wraps a context error of the server's own (a write that timed
// out, mvcc.ErrTimeout, wraps its commit deadline) is etcd's error, never
// DeadlineExceeded, which clientv3 answers by sending the request again —
// a write that had landed would be applied twice. Other context errors
// pass through so gRPC reports Canceled/DeadlineExceeded as etcd does;
// anything unknown becomes codes.Unknown with the error's text, as etcd
// does.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	for _, m := range table {
		if errors.Is(err, m.domain) {
			return m.grpc
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}

// Wire is the status a client receives for a handler's error: the error's
// own status, or for a bare context error (ToGRPC passes them through, as
// etcd does) the Canceled or DeadlineExceeded that gRPC substitutes, not
// Unknown. Metrics and the slow-request log report what the client saw.
func Wire(err error) *status.Status {
	if s, ok := status.FromError(err); ok {
		return s
	}
	return status.FromContextError(err)
}
