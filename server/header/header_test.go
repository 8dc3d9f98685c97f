package header

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/progress"
)

// Every header the filler completes raises the process's served watermark,
// never lowers it; a filler without one still fills.
func TestFillRecordsServedRevision(t *testing.T) {
	f := Filler{ClusterID: 7, MemberID: 9, Served: &progress.Served{}}
	f.Fill(&pb.ResponseHeader{Revision: 5})
	if h := f.New(3); h.ClusterId != 7 || h.MemberId != 9 || h.RaftTerm != RaftTerm || h.Revision != 3 {
		t.Fatalf("header %+v", h)
	}
	if got := f.Served.Load(); got != 5 {
		t.Fatalf("served %d after headers at 5 and 3, want 5", got)
	}
	Filler{}.Fill(&pb.ResponseHeader{Revision: 8})
	if h := (Filler{MemberID: 1}).New(8); h.MemberId != 1 || h.Revision != 8 {
		t.Fatalf("header without a watermark %+v", h)
	}
}
