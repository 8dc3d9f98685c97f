// Package maintenance is etcd's Maintenance service for a single logical
// member: status that kube-apiserver's version check accepts, the alarms
// stored for every replica, defragmentation and KV hashes computed from
// etcd's own inputs.
package maintenance

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
	"github.com/fdb-etcd/fdb-etcd/server/header"
)

// Version is the etcd version fdb-etcd reports. kube-apiserver disables
// RequestWatchProgress (and consistent reads from its cache) for anything
// below 3.4.31, for 3.5.0–3.5.12 and for unparsable versions.
const Version = "3.6.16"

// StorageVersion is the storage schema version etcd 3.6 reports.
const StorageVersion = "3.6.0"

// Hasher is what the service needs from the data model: the current and
// compacted revisions, and etcd's hash of the key space.
type Hasher interface {
	Rev(ctx context.Context) (rev, compacted int64, err error)
	HashKV(ctx context.Context, rev int64) (hash uint32, hashRev, compactRev int64, err error)
}

// Sizer reports the store's size; optional, as in storage.Sizer.
type Sizer interface {
	Size() (int64, error)
}

// Defragmenter compacts the store's files; optional.
type Defragmenter interface {
	Defragment(ctx context.Context) error
}

// Snapshotter opens a point-in-time etcd backend database (a bbolt file with
// etcd's schema, without the checksum the RPC appends) and tells its size;
// Config.Snapshotter supplies it.
type Snapshotter interface {
	OpenSnapshot(ctx context.Context) (db io.ReadCloser, size int64, err error)
}

// Alarms is the stored alarm set (package alarm).
type Alarms interface {
	// List reads the alarms of a type (every type for NONE) from the store.
	List(ctx context.Context, t pb.AlarmType) ([]*pb.AlarmMember, error)
	// Cached lists them as last seen, without a storage read.
	Cached(t pb.AlarmType) []*pb.AlarmMember
	Activate(ctx context.Context, member uint64, t pb.AlarmType) (*pb.AlarmMember, error)
	Deactivate(ctx context.Context, member uint64, t pb.AlarmType) (*pb.AlarmMember, error)
}

// Quota is the backend quota (package quota).
type Quota interface {
	// Bytes is the quota Status reports.
	Bytes() int64
	// Refresh re-reads the store's size, so that writes are measured
	// against the space that defragmentation or a disarm made available.
	Refresh()
}

// Config is what the service is built from. Sizer, Defragmenter and
// Snapshotter are optional capabilities of the backend; nil when it lacks
// them.
type Config struct {
	Store        Hasher
	Header       header.Filler
	Alarms       Alarms
	Quota        Quota
	Sizer        Sizer
	Defragmenter Defragmenter
	// Snapshotter serves Snapshot; without it Snapshot is not supported.
	Snapshotter Snapshotter
}

// Server implements pb.MaintenanceServer.
type Server struct {
	pb.UnsafeMaintenanceServer
	cfg   Config
	store Hasher
	hdr   header.Filler
}

var _ pb.MaintenanceServer = (*Server)(nil)

// New returns the Maintenance service.
func New(cfg Config) *Server {
	return &Server{cfg: cfg, store: cfg.Store, hdr: cfg.Header}
}

func (s *Server) header(ctx context.Context) (*pb.ResponseHeader, int64, error) {
	rev, _, err := s.store.Rev(ctx)
	if err != nil {
		return nil, 0, errmap.ToGRPC(err)
	}
	return s.hdr.New(rev), rev, nil
}

// Alarm lists, raises and clears alarms as etcd's apply layer does: for the
// member the request names, in the store every replica shares.
func (s *Server) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	resp := &pb.AlarmResponse{}
	var (
		m   *pb.AlarmMember
		err error
	)
	switch r.Action {
	case pb.AlarmRequest_GET:
		resp.Alarms, err = s.cfg.Alarms.List(ctx, r.Alarm)
	case pb.AlarmRequest_ACTIVATE:
		m, err = s.cfg.Alarms.Activate(ctx, r.MemberID, r.Alarm)
	case pb.AlarmRequest_DEACTIVATE:
		m, err = s.cfg.Alarms.Deactivate(ctx, r.MemberID, r.Alarm)
		if err == nil && r.Alarm == pb.AlarmType_NOSPACE {
			s.cfg.Quota.Refresh()
		}
	}
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	if m != nil {
		resp.Alarms = append(resp.Alarms, m)
	}
	if resp.Header, _, err = s.header(ctx); err != nil {
		return nil, err
	}
	return resp, nil
}

// Status reports this member, with every raised alarm among its errors as
// etcd reports them.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	h, rev, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	var size int64
	if s.cfg.Sizer != nil {
		if size, err = s.cfg.Sizer.Size(); err != nil {
			return nil, errmap.ToGRPC(err)
		}
	}
	resp := &pb.StatusResponse{
		Header:           h,
		Version:          Version,
		DbSize:           size,
		DbSizeInUse:      size,
		DbSizeQuota:      s.cfg.Quota.Bytes(),
		Leader:           s.hdr.MemberID,
		RaftIndex:        uint64(rev),
		RaftAppliedIndex: uint64(rev),
		RaftTerm:         header.RaftTerm,
		StorageVersion:   StorageVersion,
		DowngradeInfo:    &pb.DowngradeInfo{},
	}
	for _, a := range s.cfg.Alarms.Cached(pb.AlarmType_NONE) {
		// etcd 3.6 renders the alarm with gogoproto's compact text format,
		// trailing space included.
		resp.Errors = append(resp.Errors, fmt.Sprintf("memberID:%d alarm:%s ", a.MemberID, a.Alarm))
	}
	return resp, nil
}

// Defragment compacts the store's files where the backend can, then
// re-reads the store's size for the quota.
func (s *Server) Defragment(ctx context.Context, _ *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	if s.cfg.Defragmenter != nil {
		if err := s.cfg.Defragmenter.Defragment(ctx); err != nil {
			return nil, errmap.ToGRPC(err)
		}
	}
	s.cfg.Quota.Refresh()
	h, _, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.DefragmentResponse{Header: h}, nil
}

// Hash is etcd's whole-backend hash. fdb-etcd's backend holds nothing but the
// KV history that HashKV covers, so it hashes that at the current revision.
func (s *Server) Hash(ctx context.Context, _ *pb.HashRequest) (*pb.HashResponse, error) {
	hash, rev, _, err := s.store.HashKV(ctx, 0)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	h := crc32.NewIEEE()
	h.Write([]byte{byte(hash >> 24), byte(hash >> 16), byte(hash >> 8), byte(hash)})
	return &pb.HashResponse{Header: s.hdr.New(rev), Hash: h.Sum32()}, nil
}

// HashKV hashes the KV history up to a revision, as etcd does.
func (s *Server) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	hash, hashRev, compactRev, err := s.store.HashKV(ctx, r.Revision)
	if err != nil {
		return nil, errmap.ToGRPC(err)
	}
	h, _, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.HashKVResponse{Header: h, Hash: hash, CompactRevision: compactRev, HashRevision: hashRev}, nil
}

// snapshotChunk is etcd's snapshot send buffer.
const snapshotChunk = 32 * 1024

// Snapshot streams a point-in-time database as etcd does: chunks with the
// bytes still to come, then the sha256 of the database as the last message,
// every message carrying the storage version and no header.
func (s *Server) Snapshot(r *pb.SnapshotRequest, stream grpc.ServerStreamingServer[pb.SnapshotResponse]) error {
	if s.cfg.Snapshotter == nil {
		return rpctypes.ErrGRPCNotCapable
	}
	db, total, err := s.cfg.Snapshotter.OpenSnapshot(stream.Context())
	if err != nil {
		return errmap.ToGRPC(err)
	}
	defer db.Close()
	h := sha256.New()
	for sent := int64(0); sent < total; {
		// Send does not wait for the message to go out: a fresh buffer each.
		buf := make([]byte, min(snapshotChunk, total-sent))
		n, err := io.ReadFull(db, buf)
		if err != nil {
			return errmap.ToGRPC(err)
		}
		sent += int64(n)
		if err := stream.Send(&pb.SnapshotResponse{RemainingBytes: uint64(total - sent), Blob: buf, Version: StorageVersion}); err != nil {
			return err
		}
		h.Write(buf)
	}
	return stream.Send(&pb.SnapshotResponse{Blob: h.Sum(nil), Version: StorageVersion})
}

// MoveLeader: this member is always the leader; moving leadership to itself
// is a no-op and any other target is not a member.
func (s *Server) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	if r.TargetID != s.hdr.MemberID {
		return nil, rpctypes.ErrGRPCBadLeaderTransferee
	}
	h, _, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.MoveLeaderResponse{Header: h}, nil
}

// Downgrade: fdb-etcd has no cluster version to downgrade.
func (s *Server) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	switch r.Action {
	case pb.DowngradeRequest_CANCEL:
		return nil, rpctypes.ErrGRPCNoInflightDowngrade
	default:
		return nil, rpctypes.ErrGRPCInvalidDowngradeTargetVersion
	}
}
