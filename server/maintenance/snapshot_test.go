package maintenance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
)

type fakeSnap struct {
	db     []byte
	closed bool
}

func (f *fakeSnap) OpenSnapshot(context.Context) (io.ReadCloser, int64, error) {
	return f, int64(len(f.db)), nil
}

func (f *fakeSnap) Read(p []byte) (int, error) {
	if len(f.db) == 0 {
		return 0, io.EOF
	}
	n := copy(p, f.db)
	f.db = f.db[n:]
	return n, nil
}

func (f *fakeSnap) Close() error { f.closed = true; return nil }

type sendStream struct {
	grpc.ServerStream
	msgs []*pb.SnapshotResponse
}

func (s *sendStream) Context() context.Context { return context.Background() }
func (s *sendStream) Send(m *pb.SnapshotResponse) error {
	s.msgs = append(s.msgs, m)
	return nil
}

func TestSnapshotStreamsLikeEtcd(t *testing.T) {
	db := make([]byte, 3*snapshotChunk+100)
	for i := range db {
		db[i] = byte(i * 13)
	}
	fs := &fakeSnap{db: bytes.Clone(db)}
	s := New(Config{Snapshotter: fs})
	st := &sendStream{}
	if err := s.Snapshot(&pb.SnapshotRequest{}, st); err != nil {
		t.Fatal(err)
	}
	if !fs.closed {
		t.Error("snapshot not closed")
	}
	if len(st.msgs) != 5 {
		t.Fatalf("%d messages, want 4 chunks and the checksum", len(st.msgs))
	}
	var got []byte
	for i, m := range st.msgs[:4] {
		got = append(got, m.Blob...)
		if m.RemainingBytes != uint64(len(db)-len(got)) || m.Version != StorageVersion || m.Header != nil {
			t.Errorf("message %d: remaining %d version %q header %v", i, m.RemainingBytes, m.Version, m.Header)
		}
	}
	sum := sha256.Sum256(db)
	last := st.msgs[4]
	if !bytes.Equal(got, db) || !bytes.Equal(last.Blob, sum[:]) || last.RemainingBytes != 0 || last.Version != StorageVersion {
		t.Errorf("checksum message %+v", last)
	}
}

func TestSnapshotNotCapable(t *testing.T) {
	s := New(Config{})
	if err := s.Snapshot(&pb.SnapshotRequest{}, &sendStream{}); !errors.Is(err, rpctypes.ErrGRPCNotCapable) {
		t.Fatalf("got %v", err)
	}
}
