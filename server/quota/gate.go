package quota

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/server/kv"
	"github.com/fdb-etcd/fdb-etcd/server/leasesvc"
)

// Alarms is the alarm store the gates consult and raise NOSPACE in.
type Alarms interface {
	// Active reports whether any member has raised an alarm of type t.
	Active(t pb.AlarmType) bool
	// Raised reports whether member has raised an alarm of type t.
	Raised(member uint64, t pb.AlarmType) bool
	Activate(ctx context.Context, member uint64, t pb.AlarmType) (*pb.AlarmMember, error)
}

// checker is etcd's quotaAlarmer: the quota check of the gRPC layer.
type checker struct {
	q      *Quota
	alarms Alarms
	member uint64
	lg     *zap.Logger
}

// check refuses a request of the given cost that does not fit, raising
// this member's NOSPACE alarm; the request is refused whether or not the
// alarm could be recorded, as in etcd.
func (c *checker) check(ctx context.Context, cost int) error {
	if c.q.Available(cost) {
		return nil
	}
	if !c.alarms.Raised(c.member, pb.AlarmType_NOSPACE) {
		c.lg.Warn("request exceeds the backend quota; raising the NOSPACE alarm",
			zap.Int64("quota-size-bytes", c.q.Bytes()), zap.Int("request-cost-bytes", cost))
		if _, err := c.alarms.Activate(ctx, c.member, pb.AlarmType_NOSPACE); err != nil {
			c.lg.Warn("raising the NOSPACE alarm", zap.Error(err))
		}
	}
	return rpctypes.ErrGRPCNoSpace
}

// Gate holds what the quota checks need.
type Gate struct {
	c checker
}

// NewGate returns the gate of member, which raises its alarms in alarms.
func NewGate(q *Quota, alarms Alarms, member uint64, lg *zap.Logger) *Gate {
	if lg == nil {
		lg = zap.NewNop()
	}
	return &Gate{c: checker{q: q, alarms: alarms, member: member, lg: lg}}
}

// KV checks Put and Txn against the quota before next sees them (etcd's
// quotaKVServer: ahead of validation).
func (g *Gate) KV(next pb.KVServer) pb.KVServer { return &quotaKV{KVServer: next, c: &g.c} }

// Lease checks LeaseGrant against the quota before next sees it.
func (g *Gate) Lease(next pb.LeaseServer) pb.LeaseServer {
	return &quotaLease{LeaseServer: next, c: &g.c}
}

type quotaKV struct {
	pb.KVServer
	c *checker
}

func (s *quotaKV) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := s.c.check(ctx, PutCost(r)); err != nil {
		return nil, err
	}
	return s.KVServer.Put(ctx, r)
}

func (s *quotaKV) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := s.c.check(ctx, TxnCost(r)); err != nil {
		return nil, err
	}
	return s.KVServer.Txn(ctx, r)
}

type quotaLease struct {
	pb.LeaseServer
	c *checker
}

func (s *quotaLease) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if err := s.c.check(ctx, LeaseGrantCost); err != nil {
		return nil, err
	}
	return s.LeaseServer.LeaseGrant(ctx, r)
}

// alarmed is etcd's capped and corrupt appliers: the refusals that follow
// from raised alarms, checked where etcd applies a request, after
// validation. CORRUPT refuses every write, NOSPACE the writes that add data.
type alarmed struct{ alarms Alarms }

func (a alarmed) refuse(adds bool) error {
	switch {
	case a.alarms.Active(pb.AlarmType_CORRUPT):
		return rpctypes.ErrGRPCCorrupt
	case adds && a.alarms.Active(pb.AlarmType_NOSPACE):
		return rpctypes.ErrGRPCNoSpace
	}
	return nil
}

// CappedStore refuses writes to next while alarms say so.
func (g *Gate) CappedStore(next kv.Evaluator) kv.Evaluator {
	return &cappedStore{Evaluator: next, a: alarmed{g.c.alarms}}
}

type cappedStore struct {
	kv.Evaluator
	a alarmed
}

func (s *cappedStore) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := s.a.refuse(true); err != nil {
		return nil, err
	}
	return s.Evaluator.Put(ctx, r)
}

func (s *cappedStore) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := s.a.refuse(false); err != nil {
		return nil, err
	}
	return s.Evaluator.DeleteRange(ctx, r)
}

// Txn: etcd answers a Txn of top-level ranges only without applying it, so
// alarms do not refuse it.
func (s *cappedStore) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if !mvcc.TxnReadOnly(r) {
		if err := s.a.refuse(TxnCost(r) > 0); err != nil {
			return nil, err
		}
	}
	return s.Evaluator.Txn(ctx, r)
}

func (s *cappedStore) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	if err := s.a.refuse(false); err != nil {
		return nil, err
	}
	return s.Evaluator.Compact(ctx, r)
}

// CappedLessor refuses grants and revokes to next while alarms say so.
func (g *Gate) CappedLessor(next leasesvc.Lessor) leasesvc.Lessor {
	return &cappedLessor{Lessor: next, a: alarmed{g.c.alarms}}
}

type cappedLessor struct {
	leasesvc.Lessor
	a alarmed
}

func (l *cappedLessor) Grant(ctx context.Context, id, ttl int64) (lease.Granted, error) {
	if err := l.a.refuse(true); err != nil {
		return lease.Granted{}, err
	}
	return l.Lessor.Grant(ctx, id, ttl)
}

func (l *cappedLessor) Revoke(ctx context.Context, id int64) (int64, error) {
	if err := l.a.refuse(false); err != nil {
		return 0, err
	}
	return l.Lessor.Revoke(ctx, id)
}
