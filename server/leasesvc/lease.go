// Package leasesvc is etcd's Lease service: each handler calls the lessor, maps
// the error and fills the header, answering as etcd's v3rpc lease server does.
package leasesvc

import (
	"context"
	"errors"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Lessor is what the Lease service needs from the domain.
type Lessor interface {
	Grant(ctx context.Context, id, ttl int64) (lease.Granted, error)
	Revoke(ctx context.Context, id int64) (int64, error)
	Renew(ctx context.Context, id int64) (ttl, rev int64, err error)
	TimeToLive(ctx context.Context, id int64, keys bool) (lease.Status, error)
	Leases(ctx context.Context) ([]int64, int64, error)
}

// Server implements pb.LeaseServer.
type Server struct {
	pb.UnsafeLeaseServer
	le  Lessor
	hdr header.Filler
}

var _ pb.LeaseServer = (*Server)(nil)

// New returns the Lease service.
func New(le Lessor, hdr header.Filler) *Server {
	return &Server{le: le, hdr: hdr}
}

// LeaseGrant grants a lease.
func (s *Server) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	g, err := s.le.Grant(ctx, r.ID, r.TTL)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return &pb.LeaseGrantResponse{Header: s.hdr.New(g.Revision), ID: g.ID, TTL: g.TTL}, nil
}

// LeaseRevoke revokes a lease and deletes its keys in one revision.
func (s *Server) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	rev, err := s.le.Revoke(ctx, r.ID)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return &pb.LeaseRevokeResponse{Header: s.hdr.New(rev)}, nil
}

// LeaseKeepAlive renews leases as the client asks, one response per request;
// an unknown lease gets TTL 0, as in etcd.
func (s *Server) LeaseKeepAlive(stream grpc.BidiStreamingServer[pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse]) error {
	ctx := stream.Context()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ttl, rev, err := s.le.Renew(ctx, req.ID)
		if errors.Is(err, lease.ErrLeaseNotFound) {
			ttl, err = 0, nil
		}
		if err != nil {
			return errmap.ToGRPC(err)
		}
		if err := stream.Send(&pb.LeaseKeepAliveResponse{Header: s.hdr.New(rev), ID: req.ID, TTL: ttl}); err != nil {
			return err
		}
	}
}

// LeaseTimeToLive reports a lease's remaining and granted TTL; an unknown
// lease gets TTL -1, as in etcd.
func (s *Server) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	st, err := s.le.TimeToLive(ctx, r.ID, r.Keys)
	if errors.Is(err, lease.ErrLeaseNotFound) {
		return &pb.LeaseTimeToLiveResponse{Header: s.hdr.New(st.Revision), ID: r.ID, TTL: -1}, nil
	}
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	return &pb.LeaseTimeToLiveResponse{Header: s.hdr.New(st.Revision), ID: r.ID, TTL: st.TTL, GrantedTTL: st.GrantedTTL, Keys: st.Keys}, nil
}

// LeaseLeases lists every lease.
func (s *Server) LeaseLeases(ctx context.Context, _ *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	ids, rev, err := s.le.Leases(ctx)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	out := make([]*pb.LeaseStatus, len(ids))
	for i, id := range ids {
		out[i] = &pb.LeaseStatus{ID: id}
	}
	return &pb.LeaseLeasesResponse{Header: s.hdr.New(rev), Leases: out}, nil
}
