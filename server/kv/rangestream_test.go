package kv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
)

// TestRangeStreamMergesToRange checks etcd 3.7's contract: merging every
// chunk gives the Range response, chunks before the last carry only kvs, and
// writes after the stream starts are not seen.
func TestRangeStreamMergesToRange(t *testing.T) {
	s := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	val := string(make([]byte, 3000))
	for i := 0; i < 1200; i++ {
		if _, err := s.Client.Put(ctx, fmt.Sprintf("/r/%04d", i), val); err != nil {
			t.Fatal(err)
		}
	}
	kvc := pb.NewKVClient(s.Client.ActiveConnection())
	for _, limit := range []int64{0, 1, 35, 1199, 1200, 5000} {
		req := &pb.RangeRequest{Key: []byte("/r/"), RangeEnd: []byte("/r0"), Limit: limit}
		want, err := kvc.Range(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := kvc.RangeStream(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		merged := &pb.RangeResponse{}
		chunks := 0
		for {
			c, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if chunks == 0 {
				// A write after the first chunk must not show up.
				if _, err := s.Client.Put(ctx, "/r/9999", "late"); err != nil {
					t.Fatal(err)
				}
			}
			chunks++
			proto.Merge(merged, c.RangeResponse)
		}
		if !proto.Equal(merged, want) {
			t.Fatalf("limit %d: merged stream differs: count %d/%d more %v/%v kvs %d/%d rev %d/%d", limit,
				merged.Count, want.Count, merged.More, want.More, len(merged.Kvs), len(want.Kvs),
				merged.Header.GetRevision(), want.Header.GetRevision())
		}
		if limit == 0 && chunks < 3 {
			t.Fatalf("a %d-byte range came in %d chunks", proto.Size(want), chunks)
		}
		if _, err := s.Client.Delete(ctx, "/r/9999"); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := kvc.RangeStream(ctx, &pb.RangeRequest{Key: []byte("/r/"), RangeEnd: []byte("/r0"), SortOrder: pb.RangeRequest_DESCEND})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("custom sort order: %v", err)
	}
}
