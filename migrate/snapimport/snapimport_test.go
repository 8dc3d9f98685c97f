package snapimport_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/migrate/snapimport"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/mvcc/mvcctest"
	"github.com/fdb-etcd/fdb-etcd/snapshot"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// The differential test against a real etcd is test/etcdcompat's
// TestImportSnapshotCompat. These tests check what it cannot: that the
// import survives retried transactions (commit_unknown_result) and resumes
// after an interruption, on both backends, with history larger than one
// transaction.

const testLease = 0x1234

// sourceStore writes a random history (puts of up to 250 kB, multi-op
// txns, range deletes, keys on a lease) and compacts it halfway.
func sourceStore(t *testing.T, seed uint64) *mvcc.Store {
	t.Helper()
	ctx := context.Background()
	db := testdb.Open(t)
	if err := db.Update(ctx, func(tx storage.Tx) error {
		return lease.WriteImported(tx, testLease, 60, time.Now().Add(time.Minute))
	}); err != nil {
		t.Fatal(err)
	}
	s, err := mvcc.Open(db, mvcc.Config{SoleWriter: testdb.Backend() != "fdb"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	rng := rand.New(rand.NewPCG(seed, 2))
	key := func() []byte { return fmt.Appendf(nil, "k%02d", rng.IntN(40)) }
	val := func() []byte {
		if rng.IntN(20) == 0 {
			return bytes.Repeat([]byte{'v'}, 100_000+rng.IntN(150_000))
		}
		return fmt.Appendf(nil, "v%d", rng.Int())
	}
	var compacted bool
	for i := 0; i < 300; i++ {
		var err error
		switch rng.IntN(6) {
		case 0:
			_, err = s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: key(), RangeEnd: key()})
		case 1:
			// etcd refuses a txn that writes one key twice.
			ops, seen := []*pb.RequestOp{}, map[string]bool{}
			for j := 0; j < 1+rng.IntN(5); j++ {
				if k := key(); !seen[string(k)] {
					seen[string(k)] = true
					ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: val()}}})
				}
			}
			_, err = s.Txn(ctx, &pb.TxnRequest{Success: ops})
		case 2:
			_, err = s.Put(ctx, &pb.PutRequest{Key: key(), Value: val(), Lease: testLease})
		default:
			_, err = s.Put(ctx, &pb.PutRequest{Key: key(), Value: val()})
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == 150 && !compacted {
			rev, _, err := s.Rev(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: rev - 20, Physical: true}); err != nil {
				t.Fatal(err)
			}
			compacted = true
		}
	}
	return s
}

// snapshotFile writes s's snapshot (etcd's layout) and etcd's SHA-256 after it.
func snapshotFile(t *testing.T, s *mvcc.Store) string {
	t.Helper()
	snap, err := snapshot.Open(context.Background(), s, snapshot.Config{
		Dir:      t.TempDir(),
		LeaseTTL: func([]byte) (int64, int64, error) { return 60, 30, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(snap); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	buf.Write(sum[:])
	path := filepath.Join(t.TempDir(), "snapshot.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// interrupting fails every Update after the first n with errInterrupted.
type interrupting struct {
	storage.DB
	left atomic.Int64
}

var errInterrupted = errors.New("interrupted")

func (d *interrupting) Update(ctx context.Context, fn func(tx storage.Tx) error) error {
	if d.left.Add(-1) < 0 {
		return errInterrupted
	}
	return d.DB.Update(ctx, fn)
}

func TestImportRetriedAndResumed(t *testing.T) {
	ctx := context.Background()
	src := sourceStore(t, 1)
	path := snapshotFile(t, src)
	raw := testdb.Open(t)
	cfg := snapimport.Config{Path: path, BatchBytes: 8 << 10}

	cut := &interrupting{DB: raw}
	cut.left.Store(6)
	if _, err := snapimport.Import(ctx, cut, cfg); !errors.Is(err, errInterrupted) {
		t.Fatalf("interrupted import: %v", err)
	}
	other := snapshotFile(t, sourceStore(t, 2))
	if _, err := snapimport.Import(ctx, raw, snapimport.Config{Path: other}); !errors.Is(err, mvcc.ErrNotEmpty) {
		t.Fatalf("import of another snapshot over an interrupted one: %v, want ErrNotEmpty", err)
	}

	faults := faulty.Wrap(raw, faulty.Options{Seed: 7, CommitUnknownProbability: 0.4, RetryProbability: 0.2})
	res, err := snapimport.Import(ctx, faults, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resumed import: %+v; faults: %d unknown results, %d retries", res, faults.Stats.Unknowns.Load(), faults.Stats.Retries.Load())
	if faults.Stats.Unknowns.Load() == 0 {
		t.Fatal("no commit_unknown_result was injected")
	}
	if _, err := snapimport.Import(ctx, raw, cfg); !errors.Is(err, mvcc.ErrNotEmpty) {
		t.Fatalf("second import: %v, want ErrNotEmpty", err)
	}
	dst, err := mvcc.Open(raw, mvcc.Config{SoleWriter: testdb.Backend() != "fdb"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	compareStores(t, src, dst)
}

// compareStores checks that dst answers as src: the revisions, every Range
// and HashKV from the compaction revision on, the events from there, and
// the lease attachments.
func compareStores(t *testing.T, src, dst *mvcc.Store) {
	t.Helper()
	ctx := context.Background()
	head, compacted, err := src.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dHead, dCompacted, err := dst.Rev(ctx)
	if err != nil || dHead != head || dCompacted != compacted {
		t.Fatalf("imported store at revision %d compacted %d (%v), source at %d compacted %d", dHead, dCompacted, err, head, compacted)
	}
	for rev := compacted; rev <= head; rev++ {
		if rev != compacted && rev != head && rev%8 != 0 {
			continue // the events below cover every revision
		}
		r := &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev}
		a, aerr := src.Range(ctx, r)
		b, berr := dst.Range(ctx, r)
		if aerr != nil || berr != nil || !proto.Equal(a, b) {
			t.Fatalf("Range at %d: source %v (%v), imported %v (%v)", rev, brief(a), aerr, brief(b), berr)
		}
		if rev%16 != 0 && rev != compacted && rev != head {
			continue // HashKV walks all history: a few revisions suffice
		}
		ha, _, ca, aerr := src.HashKV(ctx, rev)
		hb, _, cb, berr := dst.HashKV(ctx, rev)
		if ha != hb || ca != cb || aerr != nil || berr != nil {
			t.Fatalf("HashKV at %d: source %d/%d (%v), imported %d/%d (%v)", rev, ha, ca, aerr, hb, cb, berr)
		}
	}
	ea, _, err := mvcctest.ReadEvents(ctx, src, compacted, int(head-compacted+1))
	if err != nil {
		t.Fatal(err)
	}
	eb, _, err := mvcctest.ReadEvents(ctx, dst, compacted, int(head-compacted+1))
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) {
		t.Fatalf("events of %d revisions from %d, imported %d", len(ea), compacted, len(eb))
	}
	for i := range ea {
		if ea[i].Rev != eb[i].Rev || len(ea[i].Events) != len(eb[i].Events) {
			t.Fatalf("revision %d: %d events, imported revision %d: %d", ea[i].Rev, len(ea[i].Events), eb[i].Rev, len(eb[i].Events))
		}
		for j := range ea[i].Events {
			if !proto.Equal(ea[i].Events[j], eb[i].Events[j]) {
				t.Fatalf("revision %d event %d: %v, imported %v", ea[i].Rev, j, ea[i].Events[j], eb[i].Events[j])
			}
		}
	}
	if a, b := attachments(t, src.DB()), attachments(t, dst.DB()); a != b {
		t.Fatalf("lease attachments: source %s, imported %s", a, b)
	}
}

func attachments(t *testing.T, db storage.DB) string {
	t.Helper()
	var out []string
	begin := keyspace.AttachPrefix(testLease)
	if err := db.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(begin, storage.Strinc(begin), storage.RangeOptions{})
		out = out[:0]
		for _, kv := range kvs {
			out = append(out, string(kv.Key[len(begin):]))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, ",")
}

func brief(r *pb.RangeResponse) string {
	if r == nil {
		return "nil"
	}
	return fmt.Sprintf("rev %d, %d kvs", r.Header.GetRevision(), len(r.Kvs))
}

func TestImportRefusesABadHash(t *testing.T) {
	src := sourceStore(t, 1)
	path := snapshotFile(t, src)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := testdb.Open(t)
	_, err = snapimport.Import(context.Background(), dst, snapimport.Config{Path: path})
	if err == nil || !strings.Contains(err.Error(), "hash mismatch") {
		t.Fatalf("import of a corrupt snapshot: %v", err)
	}
	if err := os.WriteFile(path, b[:len(b)-sha256.Size], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = snapimport.Import(context.Background(), dst, snapimport.Config{Path: path})
	if err == nil || !strings.Contains(err.Error(), "missing hash") {
		t.Fatalf("import of a snapshot without its hash: %v", err)
	}
	if err := dst.View(context.Background(), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange([]byte{0x01}, []byte{0xfe}, storage.RangeOptions{Limit: 1})
		if err == nil && len(kvs) > 0 {
			err = fmt.Errorf("refused import left %x", kvs[0].Key)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
