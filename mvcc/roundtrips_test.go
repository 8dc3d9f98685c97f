package mvcc_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage/opcount"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files")

// TestRoundTripsPerRequest pins the FoundationDB work of each kind of etcd
// request on a warm store: read versions, sequential read round trips, read
// requests, commits, and the keys and bytes each writes. A change that adds
// a round trip or a key per revision changes testdata/roundtrips.golden, so
// it is seen in review instead of surfacing as a slower benchmark. Rewrite
// the file with -update. The counts are the store's; the watch hub's tail
// read of each new revision and lease keep-alives are counted in their own
// packages.
func TestRoundTripsPerRequest(t *testing.T) {
	db := opcount.Wrap(openPebble(t))
	s := openStore(t, db, mvcc.Config{})
	ctx := context.Background()
	value := strings.Repeat("v", 256)
	for i := range 1000 {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "list/%04d", i), Value: make([]byte, 2048)}); err != nil {
			t.Fatal(err)
		}
	}
	mustPut := func(key string) {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: []byte(value)}); err != nil {
			t.Fatal(err)
		}
	}
	mustPut("warm")
	cmp := func(key string, rev int64) []*pb.Compare {
		return []*pb.Compare{{Key: []byte(key), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
			TargetUnion: &pb.Compare_ModRevision{ModRevision: rev}}}
	}
	putOp := func(key string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value)}}}
	}
	getOp := func(key string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key)}}}
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"put, new key", func() error {
			_, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k1"), Value: []byte(value)})
			return err
		}},
		{"put, existing key", func() error {
			_, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k1"), Value: []byte(value)})
			return err
		}},
		{"range, 1 key, linearizable", func() error { _, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("k1")}); return err }},
		{"range, 1 key, serializable", func() error {
			_, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("k1"), Serializable: true})
			return err
		}},
		{"range, 1000 keys count only", func() error {
			_, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("list/"), RangeEnd: []byte("list0"), CountOnly: true})
			return err
		}},
		{"range, first page of 500 of 1000 keys x 2 KiB", func() error {
			_, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("list/"), RangeEnd: []byte("list0"), Limit: 500})
			return err
		}},
		{"range, second page of 500 at the first's revision", func() error {
			rev, _, err := s.Rev(ctx)
			if err != nil {
				return err
			}
			db.Reset()
			_, err = s.Range(ctx, &pb.RangeRequest{Key: []byte("list/0500"), RangeEnd: []byte("list0"), Limit: 500, Revision: rev})
			return err
		}},
		{"txn, mod-revision compare + put (kube update)", func() error {
			r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte("k1")})
			if err != nil {
				return err
			}
			db.Reset()
			_, err = s.Txn(ctx, &pb.TxnRequest{Compare: cmp("k1", r.Kvs[0].ModRevision), Success: []*pb.RequestOp{putOp("k1")}, Failure: []*pb.RequestOp{getOp("k1")}})
			return err
		}},
		{"txn, failed compare + get", func() error {
			_, err := s.Txn(ctx, &pb.TxnRequest{Compare: cmp("k1", 1), Success: []*pb.RequestOp{putOp("k1")}, Failure: []*pb.RequestOp{getOp("k1")}})
			return err
		}},
		{"delete range, 1 key", func() error { _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k1")}); return err }},
	}
	var b strings.Builder
	for _, st := range steps {
		db.Reset()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		c := db.Reset()
		// Keys and bytes read depend on the backend's page sizes; the
		// round trips and what is written do not.
		fmt.Fprintf(&b, "%s: round_trips=%d attempts=%d read_versions=%d read_rounds=%d reads=%d commits=%d keys_written=%d bytes_written=%d\n",
			st.name, c.RoundTrips(), c.Attempts, c.ReadVersions, c.ReadRounds, c.Reads, c.Commits, c.KeysWritten, c.BytesWritten)
		t.Logf("%s: %v", st.name, c)
	}
	golden := "roundtrips.golden"
	if mvcc.RaceBuild {
		golden = "roundtrips-race.golden" // with the sequencer's invariant reads
	}
	compareGolden(t, filepath.Join("testdata", golden), b.String())
}

func compareGolden(t *testing.T, path, got string) {
	t.Helper()
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("FoundationDB work per request changed (rewrite with -update if intended):\n got:\n%s\nwant:\n%s", got, want)
	}
}

// TestBatchReadsInOneRoundTrip: a batch of concurrent puts and kube-style
// updates reads everything it needs in one round trip with the head, however
// many requests it holds, instead of one read per request.
func TestBatchReadsInOneRoundTrip(t *testing.T) {
	db := opcount.Wrap(openPebble(t))
	var mu sync.Mutex
	var sizes []int
	s := openStore(t, db, mvcc.Config{Sequencer: revision.Config{Observe: func(n, _ int, _ time.Duration) {
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
	}}})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Appendf(nil, "k/%02d", i)
			if _, err := s.Put(ctx, &pb.PutRequest{Key: key, Value: []byte("v"), PrevKv: true}); err != nil {
				t.Error(err)
			}
			cmp := []*pb.Compare{{Key: key, Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}}}
			put := []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: []byte("w")}}}}
			if _, err := s.Txn(ctx, &pb.TxnRequest{Compare: cmp, Success: put}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c := db.Reset()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("batches %v: %v", sizes, c)
	want := c.Attempts
	if mvcc.RaceBuild {
		// The invariant checks read once per attempt and twice per
		// revision written (128 here).
		want = 2*c.Attempts + 2*128
	}
	if c.ReadRounds > want {
		t.Fatalf("%d batches (sizes %v) took %d attempts and %d read round trips, want at most %d: one per attempt", len(sizes), sizes, c.Attempts, c.ReadRounds, want)
	}
}
