package etcdcompat

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The backend quota and the NOSPACE alarm with a tiny quota on both
// servers. Their stores grow differently, so each is filled on its own
// until it refuses a write; from there on both must answer alike: the same
// errors, the same alarm list (member ids aside), the same /health, and the
// same recovery by compaction, defragmentation and disarming.

const compatQuota = 1 << 20

// fill writes 10 kB values until the server refuses one, and returns that
// error. fdb-etcd reads its store's size at most once a second, so it may
// pass the quota by a second's writes before refusing; etcd by one.
func (s *server) fill(t *testing.T) error {
	t.Helper()
	v := []byte(strings.Repeat("q", 10_000))
	deadline := time.Now().Add(time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		_, err := s.do(&pb.PutRequest{Key: []byte(fmt.Sprintf("fill/%06d", i)), Value: v})
		if err != nil {
			return err
		}
	}
	t.Fatalf("%s accepted writes for a minute past a %d-byte quota", s.name, compatQuota)
	return nil
}

// memberID is the id the server stamps on its answers.
func (s *server) memberID(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := ctxOp()
	defer cancel()
	st, err := s.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatalf("%s Status: %v", s.name, err)
	}
	return st.Header.MemberId
}

// alarmView renders an alarm answer with the server's own id as "self"
// (not its header: the revisions differ after filling different amounts).
func alarmView(s *server, self uint64, resp *pb.AlarmResponse, err error) string {
	if err != nil {
		return errStr(err)
	}
	var out []string
	for _, a := range resp.Alarms {
		id := fmt.Sprint(a.MemberID)
		if a.MemberID == self {
			id = "self"
		}
		out = append(out, id+"/"+a.Alarm.String())
	}
	return fmt.Sprintf("header=%t alarms=%v", resp.Header != nil, out)
}

func (s *server) alarm(r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	ctx, cancel := ctxOp()
	defer cancel()
	return s.maint.Alarm(ctx, r)
}

// statusErrors renders Status.errors with the member id replaced.
func (s *server) statusErrors(t *testing.T, self uint64) string {
	t.Helper()
	ctx, cancel := ctxOp()
	defer cancel()
	st, err := s.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return errStr(err)
	}
	return fmt.Sprintf("quota=%d errors=%q", st.DbSizeQuota, strings.ReplaceAll(strings.Join(st.Errors, "|"), fmt.Sprint(self), "self"))
}

func (s *server) health(t *testing.T, query string) string {
	t.Helper()
	a := s.gw(t, http.MethodGet, "/health"+query, "")
	return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(a.raw))
}

// outcomeOf renders only whether a request succeeded, and its error: the
// servers' revisions differ after filling different amounts.
func outcomeOf(_ any, err error) string {
	if err != nil {
		return errStr(err)
	}
	return "OK"
}

// TestQuotaCompat: a write past --quota-backend-bytes is refused with
// "database space exceeded" and raises NOSPACE; under the alarm, writes
// that add data are refused and everything else works; compaction,
// defragmentation and disarming bring writes back.
func TestQuotaCompat(t *testing.T) {
	t.Parallel()
	p := startPairWith(t, pairOptions{quotaBytes: compatQuota})
	both := func(what string, f func(s *server, self uint64) string) {
		t.Helper()
		ref, cand := f(p.ref, p.ref.memberID(t)), f(p.cand, p.cand.memberID(t))
		if ref != cand {
			t.Errorf("MISMATCH %s\n  etcd:     %s\n  %-9s %s", what, ref, p.cand.name+":", cand)
		}
	}
	for _, s := range []*server{p.ref, p.cand} {
		ctx, cancel := ctxOp()
		_, err := s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 500, TTL: 600})
		cancel()
		if err != nil {
			t.Fatalf("%s grant: %v", s.name, err)
		}
	}
	both("the write past the quota", func(s *server, _ uint64) string { return errStr(s.fill(t)) })
	both("alarm list", func(s *server, self uint64) string {
		r, err := s.alarm(&pb.AlarmRequest{Action: pb.AlarmRequest_GET})
		return alarmView(s, self, r, err)
	})
	both("status", func(s *server, self uint64) string { return s.statusErrors(t, self) })
	both("/health", func(s *server, _ uint64) string { return s.health(t, "") })
	both("/health?exclude=NOSPACE", func(s *server, _ uint64) string { return s.health(t, "?exclude=NOSPACE") })
	for _, c := range noSpaceCases() {
		both(c.name, func(s *server, _ uint64) string { return outcomeOf(c.do(s)) })
	}
	// etcd's recovery: free space, compact, defragment — still refused
	// while the alarm is raised — then disarm.
	both("delete", func(s *server, _ uint64) string {
		return outcomeOf(s.do(&pb.DeleteRangeRequest{Key: []byte("fill/"), RangeEnd: []byte("fill0")}))
	})
	both("compact and defragment", func(s *server, _ uint64) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rev := s.rev(t)
		if _, err := s.kv.Compact(ctx, &pb.CompactionRequest{Revision: rev, Physical: true}); err != nil {
			return "compact: " + errStr(err)
		}
		_, err := s.maint.Defragment(ctx, &pb.DefragmentRequest{})
		return outcomeOf(nil, err)
	})
	both("put before the disarm", func(s *server, _ uint64) string {
		return outcomeOf(s.do(&pb.PutRequest{Key: []byte("k"), Value: []byte("v")}))
	})
	both("disarm", func(s *server, self uint64) string {
		r, err := s.alarm(&pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, MemberID: self, Alarm: pb.AlarmType_NOSPACE})
		return alarmView(s, self, r, err)
	})
	both("disarm again", func(s *server, self uint64) string {
		r, err := s.alarm(&pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, MemberID: self, Alarm: pb.AlarmType_NOSPACE})
		return alarmView(s, self, r, err)
	})
	for _, c := range noSpaceCases() {
		both("after the recovery: "+c.name, func(s *server, _ uint64) string { return outcomeOf(c.do(s)) })
	}
	both("alarm list after the recovery", func(s *server, self uint64) string {
		r, err := s.alarm(&pb.AlarmRequest{Action: pb.AlarmRequest_GET})
		return alarmView(s, self, r, err)
	})
	both("/health after the recovery", func(s *server, _ uint64) string { return s.health(t, "") })
	both("clientv3 AlarmList", func(s *server, _ uint64) string {
		r, err := s.cli.AlarmList(context.Background())
		if err != nil {
			return errStr(err)
		}
		return fmt.Sprint(len(r.Alarms))
	})
}

// rev is the server's current revision.
func (s *server) rev(t *testing.T) int64 {
	t.Helper()
	resp, err := s.do(&pb.RangeRequest{Key: []byte("k"), Limit: 1})
	if err != nil {
		t.Fatalf("%s range: %v", s.name, err)
	}
	return resp.(*pb.RangeResponse).Header.Revision
}

type quotaCase struct {
	name string
	do   func(s *server) (any, error)
}

// noSpaceCases: what etcd refuses under NOSPACE (Put, LeaseGrant, a Txn
// with a put in either branch or in a nested Txn) and what it allows.
func noSpaceCases() []quotaCase {
	kvc := func(r any) func(s *server) (any, error) { return func(s *server) (any, error) { return s.do(r) } }
	k := []byte("fill/000000")
	return []quotaCase{
		{"small put", kvc(&pb.PutRequest{Key: []byte("x"), Value: []byte("1")})},
		// Both check the quota before validating, so whether an empty key
		// is refused for its key or for the quota depends on the size the
		// server last measured, which each fill leaves somewhere within one
		// fill write of the quota: a value larger than a fill write's is
		// past the quota on both until the recovery, and fits after it.
		{"put with an empty key", kvc(&pb.PutRequest{Value: []byte(strings.Repeat("e", 20_000))})},
		{"txn, put in the branch not taken", kvc(txn(nil, ops(get("x", "")), ops(put("x", "1"))))},
		{"txn, put in a nested txn", kvc(txn(nil, ops(nested(nil, ops(put("x", "1")), nil)), nil))},
		{"txn of ranges", kvc(txn(nil, ops(get("fill/", "fill0")), nil))},
		{"txn with a delete", kvc(txn(nil, ops(del("x", "")), nil))},
		{"range", kvc(&pb.RangeRequest{Key: k})},
		{"delete", kvc(&pb.DeleteRangeRequest{Key: k})},
		{"lease grant", func(s *server) (any, error) {
			ctx, cancel := ctxOp()
			defer cancel()
			return s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 501, TTL: 60})
		}},
		{"lease revoke", func(s *server) (any, error) {
			ctx, cancel := ctxOp()
			defer cancel()
			return s.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: 500})
		}},
		{"clientv3 put", func(s *server) (any, error) {
			ctx, cancel := ctxOp()
			defer cancel()
			_, err := s.cli.Put(ctx, "y", "1")
			if err != nil && err.Error() == rpctypes.ErrNoSpace.Error() {
				return nil, rpctypes.ErrGRPCNoSpace
			}
			return nil, err
		}},
		{"clientv3 txn without puts", func(s *server) (any, error) {
			ctx, cancel := ctxOp()
			defer cancel()
			return s.cli.Txn(ctx).Then(clientv3.OpGet("y")).Commit()
		}},
	}
}
