package etcdcompat

import (
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Lease sequences with explicit lease IDs. Remaining TTLs are timing
// dependent: they may differ by ttlSlack seconds; everything else must match.

const ttlSlack = 2

type leaseCall struct {
	desc string
	do   func(s *server) (any, error)
}

func grant(id, ttl int64) leaseCall {
	return leaseCall{fmt.Sprintf("LeaseGrant id=%d ttl=%d", id, ttl), func(s *server) (any, error) {
		ctx, cancel := ctxOp()
		defer cancel()
		return s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: ttl})
	}}
}

func revoke(id int64) leaseCall {
	return leaseCall{fmt.Sprintf("LeaseRevoke id=%d", id), func(s *server) (any, error) {
		ctx, cancel := ctxOp()
		defer cancel()
		return s.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
	}}
}

func timeToLive(id int64, keys bool) leaseCall {
	return leaseCall{fmt.Sprintf("LeaseTimeToLive id=%d keys=%t", id, keys), func(s *server) (any, error) {
		ctx, cancel := ctxOp()
		defer cancel()
		return s.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id, Keys: keys})
	}}
}

var leases = leaseCall{"LeaseLeases", func(s *server) (any, error) {
	ctx, cancel := ctxOp()
	defer cancel()
	return s.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
}}

func keepAliveOnce(id int64) leaseCall {
	return leaseCall{fmt.Sprintf("LeaseKeepAlive (one request) id=%d", id), func(s *server) (any, error) {
		ctx, cancel := ctxOp()
		defer cancel()
		st, err := s.lease.LeaseKeepAlive(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
			return nil, err
		}
		resp, err := st.Recv()
		_ = st.CloseSend()
		return resp, err
	}}
}

func kvCall(req any) leaseCall {
	return leaseCall{reqStr(req), func(s *server) (any, error) { return s.do(req) }}
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// checkLease runs c on both servers and compares the answers, tolerating
// ttlSlack seconds of difference in remaining TTLs. It returns both answers.
func (p *pair) checkLease(t *testing.T, c leaseCall) (refResp, candResp any, refErr error) {
	t.Helper()
	refResp, refErr, candResp, candErr := p.onBoth(c.do)
	if status.Code(candErr) == codes.Unimplemented && status.Code(refErr) != codes.Unimplemented {
		t.Fatalf("%s does not implement %s: %s", p.cand.name, c.desc, errStr(candErr))
	}
	ref := respStr(refResp, refErr)
	cand := respStr(candResp, candErr)
	if refErr == nil && candErr == nil {
		switch r := refResp.(type) {
		case *pb.LeaseTimeToLiveResponse:
			if c, ok := candResp.(*pb.LeaseTimeToLiveResponse); ok && r.TTL > 0 && absDiff(r.TTL, c.TTL) <= ttlSlack {
				cc := *c
				cc.TTL = r.TTL
				cand = respStr(&cc, nil)
			}
		}
	}
	t.Logf("%s: etcd answered %s", c.desc, ref)
	if ref != cand {
		t.Errorf("MISMATCH\n  op:       %s\n  etcd:     %s\n  %-9s %s\n  note:     %s", c.desc, ref, p.cand.name+":", cand, diffHint(ref, cand))
	}
	return refResp, candResp, refErr
}

func (p *pair) checkState(t *testing.T, after string) {
	t.Helper()
	if d := p.stateDiff(); d != "" {
		t.Fatalf("after %s: %s", after, d)
	}
}

func TestLeaseCompat(t *testing.T) {
	t.Parallel()
	t.Run("api", func(t *testing.T) {
		p := startPair(t)
		p.check(t, "setup", &pb.PutRequest{Key: []byte("plain"), Value: []byte("v")})
		for _, c := range []leaseCall{
			grant(1000, 600),
			grant(1000, 600), // duplicate
			grant(1001, 600),
			grant(1002, 9000000001), // over MaxLeaseTTL
			grant(1003, 1),          // below the minimum TTL
			grant(1004, 0),
			grant(1005, -5),
			grant(-7, 60),
			grant(1006, 600),
			leases,
			// The leases of the minimum TTL (2 s) go at once: on a busy
			// machine the rest of the test outlasts them, and which server
			// expires one first is a race, not a difference.
			revoke(1003),
			revoke(1004),
			revoke(1005),
		} {
			p.checkLease(t, c)
		}

		// A lease with a server-chosen ID: only check that one is assigned.
		refG, candG, err := p.checkLeaseAutoID(t)
		if err == nil {
			if _, err := p.ref.lease.LeaseRevoke(t.Context(), &pb.LeaseRevokeRequest{ID: refG}); err != nil {
				t.Errorf("etcd revoke of its auto lease: %v", err)
			}
			if _, err := p.cand.lease.LeaseRevoke(t.Context(), &pb.LeaseRevokeRequest{ID: candG}); err != nil {
				t.Errorf("%s revoke of its auto lease %d: %s", p.cand.name, candG, errStr(err))
			}
		}

		for _, c := range []leaseCall{
			kvCall(&pb.PutRequest{Key: []byte("k1"), Value: []byte("1"), Lease: 1000}),
			kvCall(&pb.PutRequest{Key: []byte("k2"), Value: []byte("2"), Lease: 1000, PrevKv: true}),
			kvCall(&pb.PutRequest{Key: []byte("k3"), Value: []byte("3"), Lease: 1001}),
			kvCall(&pb.PutRequest{Key: []byte("k4"), Value: []byte("4"), Lease: 4242}), // unknown lease
			kvCall(&pb.PutRequest{Key: []byte("k6"), Value: []byte("6"), Lease: -7}),
			kvCall(allRange(0)),
			timeToLive(1000, true),
			timeToLive(1000, false),
			timeToLive(1001, true),
			timeToLive(4242, true), // unknown lease
			leases,
			keepAliveOnce(1000),
			keepAliveOnce(4242),
			kvCall(&pb.PutRequest{Key: []byte("k1"), Value: []byte("1b"), IgnoreLease: true, PrevKv: true}),
			kvCall(&pb.PutRequest{Key: []byte("k2"), Value: []byte("2b"), PrevKv: true}), // detaches from 1000
			kvCall(&pb.PutRequest{Key: []byte("k3"), IgnoreValue: true, Lease: 1000, PrevKv: true}),
			kvCall(txn([]*pb.Compare{{Key: []byte("k1"), Target: pb.Compare_LEASE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Lease{Lease: 1000}}},
				ops(opPut(&pb.PutRequest{Key: []byte("k5"), Value: []byte("5"), Lease: 1001}), get("k", "l")), nil)),
			kvCall(txn([]*pb.Compare{{Key: []byte("k"), RangeEnd: []byte("l"), Target: pb.Compare_LEASE, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Lease{Lease: 0}}},
				ops(get("k", "l")), ops(get("plain", "")))),
			timeToLive(1000, true),
			timeToLive(1001, true),
			kvCall(allRange(0)),
			revoke(1000),
			kvCall(allRange(0)),
			revoke(1000), // again
			revoke(4242), // unknown
			timeToLive(1000, true),
			kvCall(&pb.PutRequest{Key: []byte("k1"), Value: []byte("x"), Lease: 1000}), // revoked lease
			revoke(1001), // k5 only: k3 moved to 1000
			revoke(1006), // no keys: no revision change
			kvCall(&pb.DeleteRangeRequest{Key: []byte("k6")}), // deleting a key detaches it from its lease
			timeToLive(-7, true),
			leases,
			kvCall(allRange(0)),
		} {
			p.checkLease(t, c)
			p.checkState(t, c.desc)
		}
	})

	t.Run("expiry", func(t *testing.T) {
		p := startPair(t)
		for _, c := range []leaseCall{
			grant(2000, 2),
			kvCall(&pb.PutRequest{Key: []byte("e1"), Value: []byte("1"), Lease: 2000}),
			kvCall(&pb.PutRequest{Key: []byte("e2"), Value: []byte("2"), Lease: 2000}),
			kvCall(&pb.PutRequest{Key: []byte("stay"), Value: []byte("3")}),
		} {
			p.checkLease(t, c)
		}
		// Wait for the lease to expire on both (etcd checks every 500ms;
		// the minimum TTL is enforced, so allow a generous deadline).
		gone := func(s *server) bool {
			resp, err := s.do(&pb.RangeRequest{Key: []byte("e"), RangeEnd: []byte("f"), CountOnly: true})
			return err == nil && resp.(*pb.RangeResponse).Count == 0
		}
		deadline := time.Now().Add(15 * time.Second)
		for !(gone(p.ref) && gone(p.cand)) {
			if time.Now().After(deadline) {
				t.Fatalf("lease 2000 (ttl 2) not expired after 15s: etcd expired=%t, %s expired=%t", gone(p.ref), p.cand.name, gone(p.cand))
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.checkState(t, "lease expiry")
		for _, c := range []leaseCall{timeToLive(2000, true), leases, revoke(2000)} {
			p.checkLease(t, c)
		}
	})

	// A keep-alive after a lease's deadline never revives it: etcd answers
	// TTL 0 once the revoke is done (its lessor waits for it), and by then
	// the lease's keys are gone, at the revoke's revision.
	t.Run("keep-alive-past-deadline", func(t *testing.T) {
		p := startPair(t)
		for _, c := range []leaseCall{
			grant(2100, 2),
			kvCall(&pb.PutRequest{Key: []byte("d1"), Value: []byte("1"), Lease: 2100}),
			kvCall(&pb.PutRequest{Key: []byte("d2"), Value: []byte("2"), Lease: 2100}),
		} {
			p.checkLease(t, c)
		}
		time.Sleep(2500 * time.Millisecond) // past the deadline on both
		for _, c := range []leaseCall{keepAliveOnce(2100), kvCall(allRange(0)), timeToLive(2100, true), keepAliveOnce(2100)} {
			p.checkLease(t, c)
			p.checkState(t, c.desc)
		}
	})

	t.Run("random-kv-with-leases", func(t *testing.T) {
		p := startPair(t)
		ids := []int64{3001, 3002, 3003}
		for _, id := range ids {
			p.checkLease(t, grant(id, 600))
		}
		compacted := runRandomSequence(t, p, 11, 250, seqOpts{leases: ids, compactRev: -1, avoidQuirks: true})
		p.checkLease(t, revoke(3002))
		p.checkState(t, "revoking lease 3002")
		runRandomSequence(t, p, 12, 100, seqOpts{leases: []int64{3001, 3003}, compactRev: compacted, avoidQuirks: true})
	})
}

// checkLeaseAutoID grants a lease with ID 0 on both and checks that each
// server assigned a non-zero ID; it returns the two IDs.
func (p *pair) checkLeaseAutoID(t *testing.T) (refID, candID int64, err error) {
	t.Helper()
	ctx, cancel := ctxOp()
	defer cancel()
	r, err := p.ref.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Errorf("etcd LeaseGrant id=0: %v", err)
		return 0, 0, err
	}
	c, err := p.cand.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		t.Errorf("MISMATCH\n  op:       LeaseGrant id=0 ttl=60\n  etcd:     %s\n  %s: %s", respStr(r, nil), p.cand.name, errStr(err))
		return 0, 0, err
	}
	if c.ID <= 0 || c.TTL != r.TTL || c.Error != r.Error || c.Header.GetRevision() != r.Header.GetRevision() {
		t.Errorf("MISMATCH\n  op:       LeaseGrant id=0 ttl=60 (server-chosen ID; etcd's are positive)\n  etcd:     %s\n  %s: %s", respStr(r, nil), p.cand.name, respStr(c, nil))
	}
	return r.ID, c.ID, nil
}
