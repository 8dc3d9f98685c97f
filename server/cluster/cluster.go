// Package cluster is etcd's Cluster service. fdb-etcd's members are the
// replicas serving one store, listed from a registry in that store
// (Registry). They are not raft peers: a replica joins by starting and
// leaves by stopping, so the membership-changing calls answer with etcd's
// errors instead of changing anything.
package cluster

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Members lists the members to report, ordered by id.
type Members func(ctx context.Context) ([]*pb.Member, error)

// Server implements pb.ClusterServer.
type Server struct {
	pb.UnsafeClusterServer
	hdr     header.Filler
	members Members
}

var _ pb.ClusterServer = (*Server)(nil)

// New returns the Cluster service.
func New(hdr header.Filler, members Members) *Server {
	return &Server{hdr: hdr, members: members}
}

// MemberList lists the members. Like etcd's, its header carries no
// revision, and a linearizable request needs nothing more: the list is read
// from the store.
func (s *Server) MemberList(ctx context.Context, _ *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	h := s.hdr.New(0)
	ms, err := s.members(ctx)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return &pb.MemberListResponse{Header: h, Members: ms}, nil
}

// MemberAdd validates the peer URLs as etcd does, then refuses: replicas
// join by starting against the same store, not through raft.
func (s *Server) MemberAdd(_ context.Context, r *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	if _, err := types.NewURLs(r.PeerURLs); err != nil {
		return nil, rpctypes.ErrGRPCMemberBadURLs
	}
	return nil, rpctypes.ErrGRPCNotCapable
}

// MemberRemove knows the members it lists, and removes none: a replica
// leaves the list by stopping (or when its record's TTL runs out).
func (s *Server) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, s.unknownOrNotCapable(ctx, r.ID)
}

// MemberUpdate knows the members it lists; they have no peer URLs to
// update.
func (s *Server) MemberUpdate(ctx context.Context, r *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, s.unknownOrNotCapable(ctx, r.ID)
}

// MemberPromote: every member votes; etcd answers so for a voting member.
func (s *Server) MemberPromote(ctx context.Context, r *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	if err := s.unknownOrNotCapable(ctx, r.ID); !errors.Is(err, rpctypes.ErrGRPCNotCapable) {
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
