// Package header fills the etcd response header fields that identify the
// responding member; the store supplies the revision.
package header

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/progress"
)

// RaftTerm is the term reported by this single logical member. etcd starts a
// fresh single-node cluster at term 2; fdb-etcd never elects, so it stays.
const RaftTerm = 2

// Filler stamps headers with the cluster and member identity, and records
// each header's revision in Served: every response of every service passes
// through it, so Served is the newest revision the process has told any
// client (the watch hub's progress answers rely on it).
type Filler struct {
	ClusterID uint64
	MemberID  uint64
	Served    *progress.Served
}

// Fill completes h, keeping its revision.
func (f Filler) Fill(h *pb.ResponseHeader) {
	if h == nil {
		return
	}
	f.Served.Observe(h.Revision)
	h.ClusterId = f.ClusterID
	h.MemberId = f.MemberID
	h.RaftTerm = RaftTerm
}

// New returns a filled header at revision rev.
func (f Filler) New(rev int64) *pb.ResponseHeader {
	h := &pb.ResponseHeader{Revision: rev}
	f.Fill(h)
	return h
}
