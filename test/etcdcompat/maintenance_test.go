package etcdcompat

import (
	"context"
	"fmt"
	"testing"

	"github.com/coreos/go-semver/semver"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMaintenanceCompat checks the cluster-level answers clients rely on:
// Maintenance.Status, Cluster.MemberList and Maintenance.Alarm(GET). These
// cannot be compared byte for byte (IDs, sizes and raft indexes differ), so
// the candidate is checked against the invariants a single etcd node keeps,
// and header revisions are compared with the reference.
func TestMaintenanceCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	for i := range 3 {
		p.check(t, "setup", &pb.PutRequest{Key: []byte(fmt.Sprintf("m%d", i)), Value: []byte("v")})
	}
	ctx, cancel := ctxOp()
	defer cancel()

	var memberID uint64
	t.Run("status", func(t *testing.T) {
		ref, err := p.ref.maint.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatalf("etcd Status: %v", err)
		}
		st, err := p.cand.maint.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatalf("%s Status: %s", p.cand.name, errStr(err))
		}
		t.Logf("etcd:  %v", ref)
		t.Logf("%s: %v", p.cand.name, st)
		v, err := semver.NewVersion(st.Version)
		if err != nil {
			t.Errorf("Status.version %q is not semver: %v", st.Version, err)
		} else if v.LessThan(*semver.New("3.5.13")) {
			t.Errorf("Status.version %s < 3.5.13", v)
		}
		if st.Header == nil {
			t.Fatalf("Status has no header")
		}
		memberID = st.Header.MemberId
		if st.Header.MemberId == 0 || st.Header.ClusterId == 0 {
			t.Errorf("Status header has member_id=%d cluster_id=%d, want both non-zero", st.Header.MemberId, st.Header.ClusterId)
		}
		if st.Leader == 0 || st.Leader != st.Header.MemberId {
			t.Errorf("Status.leader=%d, want the member's own ID %d (a single node leads itself)", st.Leader, st.Header.MemberId)
		}
		if st.Header.Revision != ref.Header.Revision {
			t.Errorf("Status header revision: etcd %d, %s %d", ref.Header.Revision, p.cand.name, st.Header.Revision)
		}
		if st.RaftTerm == 0 || st.Header.RaftTerm == 0 {
			t.Errorf("Status raft_term=%d header.raft_term=%d, want non-zero (etcd: %d)", st.RaftTerm, st.Header.RaftTerm, ref.RaftTerm)
		}
		if len(st.Errors) != 0 {
			t.Errorf("Status.errors = %q, want none", st.Errors)
		}
		if st.IsLearner {
			t.Errorf("Status.isLearner = true")
		}
		if st.DbSize <= 0 {
			t.Errorf("Status.dbSize = %d, want > 0 (etcd: %d)", st.DbSize, ref.DbSize)
		}
		// clientv3's helper must be usable too (etcdctl endpoint status).
		cs, err := p.cand.cli.Status(ctx, p.cand.url)
		if err != nil {
			t.Errorf("clientv3 Status: %v", err)
		} else if cs.Version != st.Version {
			t.Errorf("clientv3 Status version %q != %q", cs.Version, st.Version)
		}
	})

	t.Run("member-list", func(t *testing.T) {
		ref, err := p.ref.cluster.MemberList(ctx, &pb.MemberListRequest{Linearizable: true})
		if err != nil {
			t.Fatalf("etcd MemberList: %v", err)
		}
		for _, lin := range []bool{false, true} {
			ml, err := p.cand.cluster.MemberList(ctx, &pb.MemberListRequest{Linearizable: lin})
			if err != nil {
				t.Errorf("%s MemberList(linearizable=%t): %s", p.cand.name, lin, errStr(err))
				continue
			}
			t.Logf("etcd:  %v", ref)
			t.Logf("%s: %v", p.cand.name, ml)
			if len(ml.Members) != 1 {
				t.Fatalf("MemberList has %d members, want 1: %v", len(ml.Members), ml.Members)
			}
			m := ml.Members[0]
			if m.Name != memberName {
				t.Errorf("member name %q, want %q (the --name flag)", m.Name, memberName)
			}
			if len(m.ClientURLs) != 1 || m.ClientURLs[0] != p.cand.url {
				t.Errorf("member clientURLs %q, want [%q] (the --advertise-client-urls flag)", m.ClientURLs, p.cand.url)
			}
			if m.ID == 0 {
				t.Errorf("member ID is 0")
			}
			if memberID != 0 && m.ID != memberID {
				t.Errorf("member ID %d differs from the Status header member_id %d", m.ID, memberID)
			}
			if ml.Header == nil || ml.Header.MemberId != m.ID {
				t.Errorf("MemberList header %v does not name member %d", ml.Header, m.ID)
			}
			if m.IsLearner {
				t.Errorf("member is a learner")
			}
			if ml.Header != nil && ml.Header.Revision != ref.Header.Revision {
				t.Errorf("MemberList header revision: etcd %d, %s %d", ref.Header.Revision, p.cand.name, ml.Header.Revision)
			}
		}
		if _, err := p.cand.cli.MemberList(ctx); err != nil {
			t.Errorf("clientv3 MemberList: %v", err)
		}
	})

	t.Run("alarm-list", func(t *testing.T) {
		ref, err := p.ref.maint.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
		if err != nil {
			t.Fatalf("etcd Alarm GET: %v", err)
		}
		al, err := p.cand.maint.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
		if err != nil {
			t.Fatalf("%s Alarm GET: %s", p.cand.name, errStr(err))
		}
		if len(al.Alarms) != 0 {
			t.Errorf("AlarmList = %v, want empty", al.Alarms)
		}
		if al.Header == nil || al.Header.Revision != ref.Header.Revision {
			t.Errorf("AlarmList header %v, etcd's revision %d", al.Header, ref.Header.Revision)
		}
		if _, err := p.cand.cli.AlarmList(ctx); err != nil {
			t.Errorf("clientv3 AlarmList: %v", err)
		}
	})

	t.Run("clientv3-kv", func(t *testing.T) {
		// The same small workload through clientv3's typed API.
		run := func(c *clientv3.Client) string {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			var out string
			add := func(resp any, err error) { out += respStr(resp, err) + "\n" }
			r1, err := c.Put(ctx, "cv3/a", "1", clientv3.WithPrevKV())
			add((*pb.PutResponse)(r1), err)
			r2, err := c.Put(ctx, "cv3/b", "2")
			add((*pb.PutResponse)(r2), err)
			r3, err := c.Get(ctx, "cv3/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
			add((*pb.RangeResponse)(r3), err)
			r4, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version("cv3/a"), "=", 1)).
				Then(clientv3.OpPut("cv3/a", "3"), clientv3.OpGet("cv3/", clientv3.WithPrefix())).
				Else(clientv3.OpDelete("cv3/a")).Commit()
			add((*pb.TxnResponse)(r4), err)
			r5, err := c.Delete(ctx, "cv3/", clientv3.WithPrefix(), clientv3.WithPrevKV())
			add((*pb.DeleteRangeResponse)(r5), err)
			r6, err := c.Get(ctx, "m", clientv3.WithFromKey(), clientv3.WithCountOnly())
			add((*pb.RangeResponse)(r6), err)
			return out
		}
		ref, cand := run(p.ref.cli), run(p.cand.cli)
		if ref != cand {
			t.Errorf("clientv3 workload differs:\netcd:\n%s%s:\n%s", ref, p.cand.name, cand)
		}
	})
}
