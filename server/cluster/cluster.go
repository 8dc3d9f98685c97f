// Package cluster is etcd's Cluster service. fdb-etcd's members are not raft
// peers: membership is not changed through this API, and each process
// reports itself.
package cluster

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Revisioner reports the current revision for response headers.
type Revisioner interface {
	Rev(ctx context.Context) (rev, compacted int64, err error)
}

// Members lists the members to report; the default is just this process.
type Members func(ctx context.Context) ([]*pb.Member, error)

// Server implements pb.ClusterServer.
type Server struct {
	pb.UnsafeClusterServer
	store   Revisioner
	hdr     header.Filler
	members Members
}

var _ pb.ClusterServer = (*Server)(nil)

// New returns the Cluster service.
func New(store Revisioner, hdr header.Filler, members Members) *Server {
	return &Server{store: store, hdr: hdr, members: members}
}

// Self returns a Members that reports one member.
func Self(id uint64, name string, clientURLs, peerURLs []string) Members {
	return func(context.Context) ([]*pb.Member, error) {
		return []*pb.Member{{ID: id, Name: name, ClientURLs: clientURLs, PeerURLs: peerURLs}}, nil
	}
}

func (s *Server) header(ctx context.Context) (*pb.ResponseHeader, error) {
	rev, _, err := s.store.Rev(ctx)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return s.hdr.New(rev), nil
}

// MemberList lists the members. Like etcd's, its header carries no revision.
func (s *Server) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	h := s.hdr.New(0)
	ms, err := s.members(ctx)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return &pb.MemberListResponse{Header: h, Members: ms}, nil
}

// MemberAdd is refused: members are fdb-etcd processes sharing a store, not
// raft peers, and join by starting.
func (s *Server) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, rpctypes.ErrGRPCNotCapable
}

// MemberRemove only knows the members it lists.
func (s *Server) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, s.unknownOrNotCapable(ctx, r.ID)
}

// MemberUpdate only knows the members it lists.
func (s *Server) MemberUpdate(ctx context.Context, r *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, s.unknownOrNotCapable(ctx, r.ID)
}

// MemberPromote: there are no learners.
func (s *Server) MemberPromote(ctx context.Context, r *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	if err := s.unknownOrNotCapable(ctx, r.ID); err != rpctypes.ErrGRPCNotCapable {
		return nil, err
	}
	return nil, rpctypes.ErrGRPCMemberNotLearner
}

func (s *Server) unknownOrNotCapable(ctx context.Context, id uint64) error {
	ms, err := s.members(ctx)
	if err != nil {
		return errmap.ToGRPC(err)
	}
	for _, m := range ms {
		if m.ID == id {
			return rpctypes.ErrGRPCNotCapable
		}
	}
	return rpctypes.ErrGRPCMemberNotFound
}
