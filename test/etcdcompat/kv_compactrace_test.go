package etcdcompat

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestRangeRevisionZeroUnderCompactionCompat lists a range longer than one
// read page at revision 0 while another client writes and compacts to the
// newest revision as fast as it can. etcd never answers a Range at revision
// 0 with "required revision has been compacted", however long the range.
func TestRangeRevisionZeroUnderCompactionCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	// The servers are independent: both run at once.
	var wg sync.WaitGroup
	for _, s := range []*server{p.ref, p.cand} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			listUnderCompaction(t, s)
		}()
	}
	wg.Wait()
}

// listUnderCompaction loads s with more keys than fdb-etcd reads in one
// transaction, then lists them at revision 0 for 5 s while another client
// compacts to the newest revision as fast as it can.
func listUnderCompaction(t *testing.T, s *server) {
	const keys = 25_000
	for i := 0; i < keys; i += 100 {
		var ops []*pb.RequestOp
		for j := i; j < i+100; j++ {
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
				Key: []byte(fmt.Sprintf("big/%06d", j)), Value: []byte("value")}}})
		}
		if _, err := s.do(&pb.TxnRequest{Success: ops}); err != nil {
			t.Errorf("%s: load: %v", s.name, err)
			return
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		compactAsFastAsPossible(ctx, s)
	}()
	deadline := time.Now().Add(5 * time.Second)
	lists := 0
	for ; time.Now().Before(deadline) || lists < 5; lists++ {
		resp, err := s.do(&pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), KeysOnly: true})
		if err != nil {
			t.Errorf("%s: Range at revision 0 (list %d): %v", s.name, lists, err)
			break
		}
		if r := resp.(*pb.RangeResponse); r.Count != keys || len(r.Kvs) != keys {
			t.Errorf("%s: Range at revision 0: count %d, %d keys; want %d", s.name, r.Count, len(r.Kvs), keys)
			break
		}
	}
	cancel()
	wg.Wait()
	t.Logf("%s: %d lists of %d keys under continuous compaction", s.name, lists, keys)
}

// compactAsFastAsPossible writes a key outside the listed range and compacts
// to the revision it made, until ctx ends.
func compactAsFastAsPossible(ctx context.Context, s *server) {
	for ctx.Err() == nil {
		resp, err := s.do(&pb.PutRequest{Key: []byte("tick"), Value: []byte("v")})
		if err != nil {
			continue
		}
		_, _ = s.do(&pb.CompactionRequest{Revision: resp.(*pb.PutResponse).Header.Revision})
	}
}
