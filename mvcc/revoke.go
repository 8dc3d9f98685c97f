package mvcc

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// RevokeRequest deletes every key a lease holds, in one revision like etcd's
// revoke, and removes the lease's record.
type RevokeRequest struct {
	ID int64
	// Fence, when set, runs first inside the same transaction; an error from
	// it aborts the revoke. Lease expiry uses it so that a deposed owner can
	// never delete.
	Fence func(tx storage.ReadTx) error
}

// FenceError wraps a Fence failure so callers can tell it from storage errors.
type FenceError struct{ Err error }

func (e *FenceError) Error() string { return "mvcc: revoke fenced: " + e.Err.Error() }
func (e *FenceError) Unwrap() error { return e.Err }

// Revoke runs a RevokeRequest through the write path.
func (s *Store) Revoke(ctx context.Context, r *RevokeRequest) (*pb.LeaseRevokeResponse, error) {
	resp, err := s.write(ctx, r, 64)
	if err != nil {
		return nil, err
	}
	return resp.(*pb.LeaseRevokeResponse), nil
}

func (s *Store) revokeChanges(tx storage.ReadTx, rev int64, id int64) (*evaluator, error) {
	attached, err := tx.GetRange(keyspace.AttachPrefix(id), storage.Strinc(keyspace.AttachPrefix(id)), storage.RangeOptions{})
	if err != nil {
		return nil, err
	}
	ev := &evaluator{tx: tx, rev: rev}
	prefix := len(keyspace.AttachPrefix(id))
	for _, a := range attached {
		key := a.Key[prefix:]
		e, err := ev.get(key)
		if err != nil {
			return nil, err
		}
		if e == nil || e.meta.Lease != id {
			continue
		}
		ev.record(change{key: e.key, prev: e, meta: meta{ModRev: rev + 1, Tombstone: true}})
	}
	return ev, nil
}

func (s *Store) applyRevoke(tx storage.Tx, rev int64, id revision.RequestID, r *RevokeRequest) (any, bool, error, error) {
	if r.Fence != nil {
		if err := r.Fence(tx); err != nil {
			var fe *FenceError
			if errors.As(err, &fe) {
				return nil, false, err, nil
			}
			return nil, false, nil, err
		}
	}
	rec, err := tx.Get(keyspace.Lease(r.ID))
	if err != nil {
		return nil, false, nil, err
	}
	if rec == nil {
		return nil, false, ErrLeaseNotFound, nil
	}
	ev, err := s.revokeChanges(tx, rev, r.ID)
	if err != nil {
		return nil, false, nil, err
	}
	tx.Clear(keyspace.Lease(r.ID))
	tx.ClearRange(keyspace.AttachPrefix(r.ID), storage.Strinc(keyspace.AttachPrefix(r.ID)))
	if len(ev.changes) == 0 {
		return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
	}
	writeChanges(tx, rev+1, id, ev.changes)
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev + 1}}, true, nil, nil
}

func (s *Store) replayRevoke(tx storage.ReadTx, rev int64, id revision.RequestID, r *RevokeRequest) (any, bool, error, error) {
	landed, err := loggedBy(tx, rev+1, id)
	if err != nil {
		return nil, false, nil, err
	}
	if landed {
		return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev + 1}}, true, nil, nil
	}
	// No keys were deleted by it: it either removed a lease without keys or
	// failed; the lease's absence cannot tell which, and both leave it gone.
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
}
