package mvcc

import (
	"context"
	"encoding/binary"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// The write path as the sequencer sees it. Each write request is a small
// type that evaluates itself (revision.Request); the store is the applier
// that gives attempts their Env and writes staged requests. None of it is
// part of the Store's API: requests enter through Put, DeleteRange, Txn,
// Compact and Revoke.

// writeResponse is what a write answers: one of etcd's responses, each with
// its header.
type writeResponse interface {
	GetHeader() *pb.ResponseHeader
}

// applier is the Store as the sequencer's Applier and Stager.
type applier struct{ s *Store }

var (
	_ revision.Stager[writeResponse]  = applier{}
	_ revision.Decider                = applier{}
	_ revision.Request[writeResponse] = putRequest{}
	_ revision.Request[writeResponse] = txnRequest{}
	_ revision.Request[writeResponse] = deleteRequest{}
	_ revision.Request[writeResponse] = (*compactRequest)(nil)
	_ revision.Request[writeResponse] = revokeRequest{}
	_ revision.Stageable              = deleteRequest{}
	_ revision.Stageable              = revokeRequest{}
)

// Begin: a batch evaluates against the compaction revision its attempt
// read first.
func (a applier) Begin(tx storage.ReadTx) (revision.Env, error) {
	a.s.tail.beginRun()
	v, err := tx.Get(keyspace.Compaction)
	if err != nil {
		return revision.Env{}, err
	}
	c, err := decodeCompaction(v)
	return revision.Env{Compacted: c.Requested}, err
}

// Decided: what a committed run wrote joins the log's tail in memory.
func (a applier) Decided(committed bool, head []byte) {
	a.s.tail.decide(committed, head, a.s.cfg.Now())
}

// Stage writes a reserved DeleteRange or revoke (stage.go).
func (a applier) Stage(ctx context.Context, r revision.Reservation, respond bool) (writeResponse, bool, error) {
	return a.s.stage(ctx, r, respond)
}

// Publish adds a staged request's last writes to the publishing transaction.
func (a applier) Publish(tx storage.Tx, r revision.Reservation, wrote bool) error {
	return a.s.publish(tx, r, wrote)
}

// kvEval evaluates one KV request with an evaluator.
type kvEval func(e *evaluator) (writeResponse, error)

// applyKV evaluates a KV request at rev and writes its changes at rev+1.
func (s *Store) applyKV(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID, eval kvEval) (writeResponse, bool, error, error) {
	ev, resp, reqErr, err := evaluate(tx, env.Compacted, rev, leaseExistsIn(tx), eval)
	if err != nil || reqErr != nil || len(ev.changes) == 0 {
		return resp, false, reqErr, err
	}
	writeChanges(tx, rev+1, id, ev.changes)
	s.tail.wrote(rev+1, ev.changes)
	return resp, true, nil, nil
}

// replayKV is the same evaluation against history, under the compaction
// revision the commit evaluated against (env, from the batch marker), not
// today's: a compaction since must not turn a committed request's answer
// into ErrCompacted. Whether the request wrote is read from the revision
// log. The history and log it reads are still there: physical compaction
// waits out every replay that could read them (compactTarget).
func replayKV(tx storage.ReadTx, env *revision.Env, rev int64, id revision.RequestID, eval kvEval) (writeResponse, bool, error, error) {
	// A replay cannot repeat the lease check: the lease may be gone since.
	anyLease := func(int64) (bool, error) { return true, nil }
	ev, resp, reqErr, err := evaluate(tx, env.Compacted, rev, anyLease, eval)
	if err != nil || reqErr != nil || len(ev.changes) == 0 {
		return resp, false, reqErr, err
	}
	landed, err := loggedBy(tx, rev+1, id)
	if err != nil {
		return nil, false, nil, err
	}
	if !landed {
		// The evaluation would have written, so the only way it did not is
		// the lease check that a replay cannot repeat.
		return nil, false, ErrLeaseNotFound, nil
	}
	return resp, true, nil, nil
}

// putRequest is a Put on its way through the sequencer.
type putRequest struct {
	s *Store
	r *pb.PutRequest
}

func (p putRequest) eval(e *evaluator) (writeResponse, error) {
	if err := e.checkLease(p.r.Lease); err != nil {
		return nil, err
	}
	return e.put(p.r)
}

func (p putRequest) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return p.s.applyKV(tx, env, rev, id, p.eval)
}

func (p putRequest) Replay(tx storage.ReadTx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return replayKV(tx, env, rev, id, p.eval)
}

// txnRequest is a Txn that writes, on its way through the sequencer.
type txnRequest struct {
	s *Store
	r *pb.TxnRequest
}

func (t txnRequest) eval(e *evaluator) (writeResponse, error) { return e.txn(t.r) }

func (t txnRequest) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return t.s.applyKV(tx, env, rev, id, t.eval)
}

func (t txnRequest) Replay(tx storage.ReadTx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return replayKV(tx, env, rev, id, t.eval)
}

// deleteRequest is a DeleteRange on its way through the sequencer; one
// deleting more than StageBytes is staged.
type deleteRequest struct {
	s *Store
	r *pb.DeleteRangeRequest
}

func (d deleteRequest) eval(e *evaluator) (writeResponse, error) { return e.deleteRange(d.r) }

func (d deleteRequest) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	if len(d.r.RangeEnd) > 0 {
		large, err := d.s.deleteOversized(tx, d.r.Key, normEnd(d.r.RangeEnd), rev)
		if err != nil {
			return nil, false, nil, err
		}
		if large {
			return nil, false, revision.ErrStage, nil
		}
	}
	return d.s.applyKV(tx, env, rev, id, d.eval)
}

func (d deleteRequest) Replay(tx storage.ReadTx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return replayKV(tx, env, rev, id, d.eval)
}

// Reserve encodes the request for whoever stages it.
func (d deleteRequest) Reserve(storage.ReadTx, revision.Env, int64) ([]byte, error, error) {
	b, err := proto.Marshal(d.r)
	if err != nil {
		return nil, nil, err
	}
	if len(b) >= maxReservedRequest {
		return nil, ErrRequestTooLarge, nil
	}
	return append([]byte{stagedDelete}, b...), nil, nil
}

// compactRequest is a Compact on its way through the sequencer.
type compactRequest struct {
	s   *Store
	rev int64
}

func (c *compactRequest) Apply(tx storage.Tx, env *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return c.s.applyCompact(tx, env, rev, id, c)
}

func (c *compactRequest) Replay(_ storage.ReadTx, env *revision.Env, rev int64, _ revision.RequestID) (writeResponse, bool, error, error) {
	return c.s.replayCompact(env, rev, c)
}

// revokeRequest is a lease revoke on its way through the sequencer; one
// deleting more than StageBytes is staged.
type revokeRequest struct {
	s *Store
	r *RevokeRequest
}

func (v revokeRequest) Apply(tx storage.Tx, _ *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return v.s.applyRevoke(tx, rev, id, v.r)
}

func (v revokeRequest) Replay(tx storage.ReadTx, _ *revision.Env, rev int64, id revision.RequestID) (writeResponse, bool, error, error) {
	return v.s.replayRevoke(tx, rev, id, v.r)
}

// Reserve runs the fence and checks the lease inside the reservation
// transaction: once reserved, the revoke happens.
func (v revokeRequest) Reserve(tx storage.ReadTx, _ revision.Env, _ int64) ([]byte, error, error) {
	if reqErr, err := checkRevoke(tx, v.r); reqErr != nil || err != nil {
		return nil, reqErr, err
	}
	return binary.BigEndian.AppendUint64([]byte{stagedRevoke}, uint64(v.r.ID)), nil, nil
}
