package snapshot_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/snapshot"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// snapshotCfg reads lease records written by putLease: 8-byte TTL, 8-byte
// remaining seconds.
func snapshotCfg(t *testing.T) snapshot.Config {
	return snapshot.Config{
		MemberID: 0xabc, MemberName: "m", ClientURLs: []string{"http://c"}, Term: 2, Dir: t.TempDir(),
		LeaseTTL: func(rec []byte) (int64, int64, error) {
			if len(rec) != 16 {
				return 0, 0, errors.New("bad record")
			}
			return int64(binary.BigEndian.Uint64(rec)), int64(binary.BigEndian.Uint64(rec[8:])), nil
		},
	}
}

func putLease(t *testing.T, db storage.DB, id, ttl, remaining int64) {
	t.Helper()
	rec := binary.BigEndian.AppendUint64(nil, uint64(ttl))
	rec = binary.BigEndian.AppendUint64(rec, uint64(remaining))
	if err := db.Update(context.Background(), func(tx storage.Tx) error {
		tx.Set(keyspace.Lease(id), rec)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// snapDB is a snapshot file opened with bbolt.
type snapDB struct {
	path string
	db   *bolt.DB
	rev  int64
	size int64
}

func takeSnapshot(t *testing.T, s *mvcc.Store, cfg snapshot.Config) *snapDB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.Open(context.Background(), s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(snap); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	rev := snap.Rev
	st, _ := f.Stat()
	f.Close()
	if left, _ := os.ReadDir(cfg.Dir); len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sd := &snapDB{path: path, db: db, rev: rev, size: st.Size()}
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		if tx.Size() != st.Size() {
			return fmt.Errorf("file has %d bytes, database %d", st.Size(), tx.Size())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return sd
}

func (sd *snapDB) get(t *testing.T, bucket, key string) []byte {
	t.Helper()
	var v []byte
	if err := sd.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return fmt.Errorf("no bucket %q", bucket)
		}
		v = bytes.Clone(b.Get([]byte(key)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

type revKV struct {
	k, v []byte
}

func (sd *snapDB) keyBucket(t *testing.T) []revKV {
	t.Helper()
	var out []revKV
	if err := sd.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("key")).ForEach(func(k, v []byte) error {
			out = append(out, revKV{bytes.Clone(k), bytes.Clone(v)})
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkSnapshot checks the key bucket against the store: the state the
// bucket implies at the snapshot's revision is the store's Range there, and
// without compaction etcd's HashKV over the bucket is the store's HashKV.
func checkSnapshot(t *testing.T, s *mvcc.Store, sd *snapDB) {
	t.Helper()
	ctx := context.Background()
	kvs := sd.keyBucket(t)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key"))
	state := map[string]*mvccpb.KeyValue{}
	var order []string
	for _, e := range kvs {
		if len(e.k) != 17 && !(len(e.k) == 18 && e.k[17] == 't') || e.k[8] != '_' {
			t.Fatalf("malformed revision key %x", e.k)
		}
		if main := int64(binary.BigEndian.Uint64(e.k)); main > sd.rev {
			t.Fatalf("revision %d above the snapshot's %d", main, sd.rev)
		}
		h.Write(e.k)
		h.Write(e.v)
		var kv mvccpb.KeyValue
		if err := proto.Unmarshal(e.v, &kv); err != nil {
			t.Fatal(err)
		}
		if _, ok := state[string(kv.Key)]; !ok {
			order = append(order, string(kv.Key))
		}
		if len(e.k) == 18 {
			state[string(kv.Key)] = nil
		} else {
			state[string(kv.Key)] = &kv
		}
	}
	// Without a compaction etcd's HashKV hashes every version; with one it
	// leaves out versions at or below it that are not in its Keep(rev), which
	// the store's HashKV does not model (test/snapshot compares with etcd).
	if _, compacted, err := s.Rev(ctx); err != nil {
		t.Fatal(err)
	} else if compacted < 0 {
		want, _, _, err := s.HashKV(ctx, sd.rev)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Sum32(); got != want {
			t.Errorf("hash of the key bucket %d, store's HashKV at %d: %d", got, sd.rev, want)
		}
	}
	r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: sd.rev})
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, k := range order {
		if state[k] != nil {
			live++
		}
	}
	if live != len(r.Kvs) {
		t.Errorf("snapshot has %d live keys, Range at %d has %d", live, sd.rev, len(r.Kvs))
	}
	for _, kv := range r.Kvs {
		if got := state[string(kv.Key)]; !proto.Equal(got, kv) {
			t.Errorf("key %q: snapshot %v, Range %v", kv.Key, got, kv)
		}
	}
}

func TestSnapshotMatchesStore(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			ctx := context.Background()
			db := faulty.Wrap(openPebble(t), faulty.Options{Seed: seed, RetryProbability: 0.2, TooOldProbability: 0.05})
			s := openStore(t, db, mvcc.Config{SoleWriter: true})
			putLease(t, db, 7, 30, 12)
			putLease(t, db, 0x7fff_0000_0000_0001, 60, -3) // overdue
			if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("leased"), Value: []byte("v"), Lease: 7}); err != nil {
				t.Fatal(err)
			}
			randomWrites(t, s, seed, 400)
			cfg := snapshotCfg(t)

			// Whatever the physical compaction has done so far, the snapshot
			// holds the compacted history.
			early := takeSnapshot(t, s, cfg)
			rev, compacted, err := s.Rev(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if early.rev != rev {
				t.Fatalf("snapshot revision %d, store %d", early.rev, rev)
			}
			if compacted < 0 {
				t.Fatalf("seed %d never compacted", seed)
			}
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: compacted + 1, Physical: true}); err != nil {
				t.Fatal(err)
			}
			compacted++
			sd := takeSnapshot(t, s, cfg)
			checkSnapshot(t, s, sd)

			// Compacting one more revision keeps a snapshot of the rest of
			// the history the same only where that revision changed nothing:
			// compare the early snapshot with the store's hash at its own
			// compaction instead.
			if len(early.keyBucket(t)) < len(sd.keyBucket(t)) {
				t.Errorf("a more compacted snapshot has more versions")
			}

			u := func(b []byte) uint64 {
				if len(b) != 8 {
					t.Fatalf("want 8 bytes, got %x", b)
				}
				return binary.BigEndian.Uint64(b)
			}
			if got := u(sd.get(t, "meta", "consistent_index")); got != uint64(rev) {
				t.Errorf("consistent_index %d, want %d", got, rev)
			}
			if got := u(sd.get(t, "meta", "term")); got != 2 {
				t.Errorf("term %d", got)
			}
			wantRev := binary.BigEndian.AppendUint64(nil, uint64(compacted))
			wantRev = append(wantRev, '_', 0, 0, 0, 0, 0, 0, 0, 0)
			for _, k := range []string{"scheduledCompactRev", "finishedCompactRev"} {
				if got := sd.get(t, "meta", k); !bytes.Equal(got, wantRev) {
					t.Errorf("%s = %x, want %x", k, got, wantRev)
				}
			}
			for _, c := range []struct{ bucket, key, want string }{
				{"meta", "storageVersion", "3.6.0"},
				{"meta", "confState", `{"voters":[2748],"auto_leave":false}`},
				{"cluster", "clusterVersion", "3.6.0"},
				{"members", "abc", `{"id":2748,"peerURLs":[],"name":"m","clientURLs":["http://c"]}`},
				{"auth", "authEnabled", ""},
				{"auth", "authRevision", "\x00\x00\x00\x00\x00\x00\x00\x01"},
			} {
				if got := string(sd.get(t, c.bucket, c.key)); got != c.want {
					t.Errorf("%s/%s = %q, want %q", c.bucket, c.key, got, c.want)
				}
			}
			for _, b := range []string{"alarm", "members_removed", "authUsers", "authRoles"} {
				sd.get(t, b, "x") // exists
			}
			for _, l := range []struct{ id, ttl, remaining int64 }{{7, 30, 12}, {0x7fff_0000_0000_0001, 60, 1}} {
				v := sd.get(t, "lease", string(binary.BigEndian.AppendUint64(nil, uint64(l.id))))
				got := map[protowire.Number]int64{}
				for len(v) > 0 {
					num, typ, n := protowire.ConsumeTag(v)
					if n < 0 || typ != protowire.VarintType {
						t.Fatalf("lease %x: bad encoding", l.id)
					}
					x, m := protowire.ConsumeVarint(v[n:])
					got[num] = int64(x)
					v = v[n+m:]
				}
				if got[1] != l.id || got[2] != l.ttl || got[3] != l.remaining {
					t.Errorf("lease %x: %v, want ID %d TTL %d RemainingTTL %d", l.id, got, l.id, l.ttl, l.remaining)
				}
			}
			if sd.size%4096 != 0 {
				t.Errorf("size %d is not whole pages", sd.size)
			}
		})
	}
}

// TestSnapshotTombstoneAtCompaction: etcd 3.6's compaction keeps each key's
// newest version at or below the compaction revision, unless it is a
// tombstone below it: a tombstone at the revision itself stays.
func TestSnapshotTombstoneAtCompaction(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, openPebble(t), mvcc.Config{SoleWriter: true})
	for _, r := range []proto.Message{
		&pb.PutRequest{Key: []byte("a"), Value: []byte("1")},           // 2
		&pb.PutRequest{Key: []byte("b"), Value: []byte("1")},           // 3
		&pb.PutRequest{Key: []byte("a"), Value: []byte("2")},           // 4
		&pb.DeleteRangeRequest{Key: []byte("a")},                       // 5
		&pb.PutRequest{Key: []byte("b"), Value: []byte("2")},           // 6
		&pb.DeleteRangeRequest{Key: []byte("b")},                       // 7
		&pb.PutRequest{Key: []byte("c"), Value: []byte("1")},           // 8
		&pb.CompactionRequest{Revision: 7, Physical: true},             // 8
		&pb.PutRequest{Key: []byte("c"), Value: []byte("2")},           // 9
		&pb.PutRequest{Key: []byte("a"), Value: []byte("3")},           // 10
		&pb.DeleteRangeRequest{Key: []byte("c")},                       // 11
		&pb.PutRequest{Key: []byte("d"), Value: make([]byte, 300_000)}, // 12, chunked
	} {
		if err := write(ctx, s, r); err != nil {
			t.Fatal(err)
		}
	}
	sd := takeSnapshot(t, s, snapshotCfg(t))
	var revs []string
	for _, e := range sd.keyBucket(t) {
		r := fmt.Sprint(binary.BigEndian.Uint64(e.k))
		if len(e.k) == 18 {
			r += "t"
		}
		revs = append(revs, r)
	}
	if got, want := fmt.Sprint(revs), "[7t 8 9 10 11t 12]"; got != want {
		t.Fatalf("key bucket revisions %s, want %s", got, want)
	}
	checkSnapshot(t, s, sd)
}

// TestSnapshotWhileWriting takes snapshots while writers run: each holds
// exactly the history at its revision.
func TestSnapshotWhileWriting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := openStore(t, faulty.Wrap(openPebble(t), faulty.Options{Seed: 9, TooOldProbability: 0.0005}), mvcc.Config{})
	for i := 0; i < 3000; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k%04d", i%1500)), Value: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				k := []byte(fmt.Sprintf("k%04d", (i*7+w*13)%1600))
				if i%5 == 0 {
					_, _ = s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k})
				} else {
					_, _ = s.Put(ctx, &pb.PutRequest{Key: k, Value: []byte(fmt.Sprint(i))})
				}
			}
		}()
	}
	var snaps []*snapDB
	for i := 0; i < 3; i++ {
		snaps = append(snaps, takeSnapshot(t, s, snapshotCfg(t)))
	}
	cancel()
	wg.Wait()
	for _, sd := range snaps {
		checkSnapshot(t, s, sd)
	}
}

// TestSnapshotWhileCompacting takes snapshots while compactions advance:
// each either succeeds with a history compacted as etcd's at its own
// compaction revision, or fails with ErrCompacted after its restarts.
func TestSnapshotWhileCompacting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := openStore(t, openPebble(t), mvcc.Config{CompactionBatch: 50})
	for i := 0; i < 4000; i++ {
		if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k%03d", i%300)), Value: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: 1000}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rev := int64(1040); ctx.Err() == nil && rev < 4000; rev += 40 {
			_, _ = s.Compact(ctx, &pb.CompactionRequest{Revision: rev})
		}
	}()
	// check takes one snapshot and checks its history; false when it gave
	// up with ErrCompacted.
	check := func() bool {
		f, err := snapshot.Open(ctx, s, snapshotCfg(t))
		if errors.Is(err, mvcc.ErrCompacted) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "snap.db")
		out, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := out.ReadFrom(f); err != nil {
			t.Fatal(err)
		}
		out.Close()
		f.Close()
		db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		sd := &snapDB{path: path, db: db, rev: f.Rev}
		perKey := map[string]int{}
		for _, e := range sd.keyBucket(t) {
			var kv mvccpb.KeyValue
			if err := proto.Unmarshal(e.v, &kv); err != nil {
				t.Fatal(err)
			}
			if int64(binary.BigEndian.Uint64(e.k)) <= f.CompactRev {
				perKey[string(kv.Key)]++
			}
		}
		if len(perKey) != 300 {
			t.Errorf("snapshot at %d compacted at %d: %d keys with a version at or below it, want 300", f.Rev, f.CompactRev, len(perKey))
		}
		for k, n := range perKey {
			if n != 1 {
				t.Errorf("key %q: %d versions at or below the compaction %d", k, n, f.CompactRev)
			}
		}
		db.Close()
		return true
	}
	ok := 0
	for i := 0; i < 5; i++ {
		if check() {
			ok++
		}
	}
	t.Logf("%d of 5 snapshots taken during compactions succeeded", ok)
	// Restarts are bounded, so a slow backend may give up on every snapshot
	// while compactions keep coming; once they stop, one must succeed.
	wg.Wait()
	if !check() {
		t.Fatal("a snapshot after the compactions ended failed with ErrCompacted")
	}
}

func openPebble(t *testing.T) storage.DB {
	t.Helper()
	return testdb.Open(t)
}

func openStore(t *testing.T, db storage.DB, cfg mvcc.Config) *mvcc.Store {
	t.Helper()
	s, err := mvcc.Open(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// write sends one write request to s.
func write(ctx context.Context, s *mvcc.Store, req proto.Message) error {
	var err error
	switch r := req.(type) {
	case *pb.PutRequest:
		_, err = s.Put(ctx, r)
	case *pb.DeleteRangeRequest:
		_, err = s.DeleteRange(ctx, r)
	case *pb.TxnRequest:
		_, err = s.Txn(ctx, r)
	case *pb.CompactionRequest:
		_, err = s.Compact(ctx, r)
	default:
		err = fmt.Errorf("not a write: %T", req)
	}
	return err
}

// randomWrites applies n random puts (some of chunked values), deletes of
// keys and ranges, Txns and compactions; requests etcd refuses (a
// compaction below the last one) fail harmlessly.
func randomWrites(t *testing.T, s *mvcc.Store, seed int64, n int) {
	t.Helper()
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(seed))
	keys := []string{"a", "a/1", "a/2", "b", "b/x", "c", "c\x00d", "d\xff", "e"}
	key := func() []byte { return []byte(keys[rnd.Intn(len(keys))]) }
	val := func() []byte {
		if rnd.Intn(20) == 0 {
			return make([]byte, 150_000+rnd.Intn(200_000)) // chunked value
		}
		return []byte(fmt.Sprintf("v%d", rnd.Intn(1000)))
	}
	for i := 0; i < n; i++ {
		var req proto.Message
		switch k := key(); rnd.Intn(6) {
		case 0, 1:
			req = &pb.PutRequest{Key: k, Value: val()}
		case 2:
			req = &pb.DeleteRangeRequest{Key: k}
		case 3:
			req = &pb.DeleteRangeRequest{Key: k, RangeEnd: append(bytes.Clone(k), 0xff)}
		case 4:
			put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: val()}}}
			del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key()}}}
			req = &pb.TxnRequest{Success: []*pb.RequestOp{put, del}}
		default:
			if i > 10 && rnd.Intn(4) == 0 {
				req = &pb.CompactionRequest{Revision: int64(rnd.Intn(i))}
			} else {
				req = &pb.PutRequest{Key: k, Value: val()}
			}
		}
		_ = write(ctx, s, req)
	}
}
