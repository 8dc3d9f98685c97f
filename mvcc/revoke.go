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
	// never delete. A revoke too large for one transaction runs its fence in
	// the transaction that reserves its revision; once reserved, it happens.
	Fence func(tx storage.ReadTx) error
}

// FenceError wraps a Fence failure so callers can tell it from storage errors.
type FenceError struct{ Err error }

func (e *FenceError) Error() string { return "mvcc: revoke fenced: " + e.Err.Error() }
func (e *FenceError) Unwrap() error { return e.Err }

// Revoke runs a RevokeRequest through the write path.
func (s *Store) Revoke(ctx context.Context, r *RevokeRequest) (*pb.LeaseRevokeResponse, error) {
	resp, err := s.write(ctx, revokeRequest{s: s, r: r}, 64)
	if err != nil {
		return nil, err
	}
	return resp.(*pb.LeaseRevokeResponse), nil
}

// checkRevoke runs the fence and checks that the lease exists.
func checkRevoke(tx storage.ReadTx, r *RevokeRequest) (reqErr, err error) {
	if r.Fence != nil {
		if err := r.Fence(tx); err != nil {
			var fe *FenceError
			if errors.As(err, &fe) {
				return err, nil
			}
			return nil, err
		}
	}
	rec, err := tx.Get(keyspace.Lease(r.ID))
	if err != nil || rec != nil {
		return nil, err
	}
	return ErrLeaseNotFound, nil
}

// leaseKeysAt returns, in key order, the keys among the attachment entries
// kvs (of lease id) that are live at rev and held by the lease: one batched
// read of their index entries, and history only for keys changed since rev
// that the index entry cannot tell about (a staged revoke reads at its
// reserved base while its own tombstones, which record what they deleted,
// are already in the index). The index decides; an attachment is only where
// to look.
func leaseKeysAt(tx storage.ReadTx, kvs []storage.KeyValue, id, rev int64) ([]*entry, error) {
	prefix := len(keyspace.AttachPrefix(id))
	keys := make([][]byte, len(kvs))
	for i, kv := range kvs {
		keys[i] = keyspace.Latest(kv.Key[prefix:])
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return nil, err
	}
	var out []*entry
	for i, v := range vals {
		if v == nil {
			continue
		}
		m, err := decodeMeta(v)
		if err != nil {
			return nil, err
		}
		key := kvs[i].Key[prefix:]
		var e *entry
		if live, ok := m.At(rev); !ok {
			if e, err = versionAt(tx, key, rev); err != nil {
				return nil, err
			}
		} else if live != nil {
			e = &entry{key: key, meta: *live}
		}
		if e != nil && e.meta.Lease == id {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *Store) applyRevoke(tx storage.Tx, rev int64, id revision.RequestID, r *RevokeRequest) (writeResponse, bool, error, error) {
	if reqErr, err := checkRevoke(tx, r); reqErr != nil || err != nil {
		return nil, false, reqErr, err
	}
	prefix := keyspace.AttachPrefix(r.ID)
	attached, err := tx.GetRange(prefix, storage.Strinc(prefix), storage.RangeOptions{Limit: s.stageKeys() + 1})
	if err != nil {
		return nil, false, nil, err
	}
	if s.overStageBytes(attached, len(prefix)) {
		return nil, false, revision.ErrStage, nil
	}
	live, err := leaseKeysAt(tx, attached, r.ID, rev)
	if err != nil {
		return nil, false, nil, err
	}
	tx.Clear(keyspace.Lease(r.ID))
	tx.ClearRange(prefix, storage.Strinc(prefix))
	if len(live) == 0 {
		return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, false, nil, nil
	}
	changes := make([]change, len(live))
	for i, e := range live {
		changes[i] = change{key: e.key, prev: e, meta: meta{ModRev: rev + 1, Tombstone: true}}
	}
	writeChanges(tx, rev+1, id, changes)
	s.tail.wrote(rev+1, changes)
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev + 1}}, true, nil, nil
}

func (s *Store) replayRevoke(tx storage.ReadTx, rev int64, id revision.RequestID, r *RevokeRequest) (writeResponse, bool, error, error) {
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
