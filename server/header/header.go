// Package header fills the etcd response header fields that identify the
// responding member; the store supplies the revision.
package header

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// RaftTerm is the term reported by this single logical member. etcd starts a
// fresh single-node cluster at term 2; fdb-etcd never elects, so it stays.
const RaftTerm = 2

// Filler stamps headers with the cluster and member identity.
type Filler struct {
	ClusterID uint64
	MemberID  uint64
}

// Fill completes h, keeping its revision.
func (f Filler) Fill(h *pb.ResponseHeader) {
	if h == nil {
		return
	}
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
