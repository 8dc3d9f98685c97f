// Package maintenance is etcd's Maintenance service for a single logical
// member: status that kube-apiserver's version check accepts, alarms,
// defragmentation and KV hashes computed from etcd's own inputs.
package maintenance

import (
	"context"
	"crypto/sha256"
	"hash/crc32"
	"io"
	"sync"

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

// Store is what the service needs from the data model.
type Store interface {
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
// WithSnapshotter supplies it.
type Snapshotter interface {
	OpenSnapshot(ctx context.Context) (db io.ReadCloser, size int64, err error)
}

// Server implements pb.MaintenanceServer.
type Server struct {
	pb.UnsafeMaintenanceServer
	store   Store
	backend any // probed for Sizer and Defragmenter
	hdr     header.Filler
	snap    Snapshotter // nil: Snapshot is not supported

	mu     sync.Mutex
	alarms map[pb.AlarmType]bool
}

var _ pb.MaintenanceServer = (*Server)(nil)

// New returns the Maintenance service. backend is probed for the optional
// capabilities.
func New(store Store, backend any, hdr header.Filler) *Server {
	return &Server{store: store, backend: backend, hdr: hdr, alarms: map[pb.AlarmType]bool{}}
}

// WithSnapshotter makes Snapshot stream the databases sn opens.
func (s *Server) WithSnapshotter(sn Snapshotter) *Server {
	s.snap = sn
	return s
}

func (s *Server) header(ctx context.Context) (*pb.ResponseHeader, int64, error) {
	rev, _, err := s.store.Rev(ctx)
	if err != nil {
		return nil, 0, errmap.ToGRPC(err)
	}
	return s.hdr.New(rev), rev, nil
}

// Alarm lists, raises and clears alarms of this member.
func (s *Server) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	h, _, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &pb.AlarmResponse{Header: h}
	member := func(t pb.AlarmType) *pb.AlarmMember {
		return &pb.AlarmMember{MemberID: s.hdr.MemberID, Alarm: t}
	}
	switch r.Action {
	case pb.AlarmRequest_GET:
		for t := range s.alarms {
			if r.Alarm == pb.AlarmType_NONE || r.Alarm == t {
				resp.Alarms = append(resp.Alarms, member(t))
			}
		}
	case pb.AlarmRequest_ACTIVATE:
		if r.Alarm != pb.AlarmType_NONE && !s.alarms[r.Alarm] {
			s.alarms[r.Alarm] = true
			resp.Alarms = append(resp.Alarms, member(r.Alarm))
		}
	case pb.AlarmRequest_DEACTIVATE:
		if s.alarms[r.Alarm] {
			delete(s.alarms, r.Alarm)
			resp.Alarms = append(resp.Alarms, member(r.Alarm))
		}
	}
	return resp, nil
}

// Status reports this member.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	h, rev, err := s.header(ctx)
	if err != nil {
		return nil, err
	}
	var size int64
	if sz, ok := s.backend.(Sizer); ok {
		if size, err = sz.Size(); err != nil {
			return nil, errmap.ToGRPC(err)
		}
	}
	resp := &pb.StatusResponse{
		Header:           h,
		Version:          Version,
		DbSize:           size,
		DbSizeInUse:      size,
		Leader:           s.hdr.MemberID,
		RaftIndex:        uint64(rev),
		RaftAppliedIndex: uint64(rev),
		RaftTerm:         header.RaftTerm,
		StorageVersion:   StorageVersion,
	}
	s.mu.Lock()
	for t := range s.alarms {
		resp.Errors = append(resp.Errors, "memberID:"+uintString(s.hdr.MemberID)+" alarm:"+t.String())
	}
	s.mu.Unlock()
	return resp, nil
}

func uintString(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// Defragment compacts the store's files where the backend can.
func (s *Server) Defragment(ctx context.Context, _ *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	if d, ok := s.backend.(Defragmenter); ok {
		if err := d.Defragment(ctx); err != nil {
			return nil, errmap.ToGRPC(err)
		}
	}
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
	if s.snap == nil {
		return rpctypes.ErrGRPCNotCapable
	}
	db, total, err := s.snap.OpenSnapshot(stream.Context())
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
