// Package snapimport loads an etcd snapshot (`etcdctl snapshot save`, or an
// etcd member's bbolt file, etcd 3.4 to 3.6) into an empty fdb-etcd
// keyspace, keeping everything a client can observe: the current and the
// compacted revision, every version still in the snapshot (so Range at a
// past revision, Watch from one and HashKV answer as the etcd did), each
// key's create and mod revision and version, and the leases with their
// remaining TTL and attached keys.
//
// etcd's layout (server/storage/schema and mvcc/kvstore.go): bucket "key"
// maps a revision (8-byte main, '_', 8-byte sub, 't' for a tombstone) to a
// marshaled mvccpb.KeyValue; bucket "meta" holds finishedCompactRev and
// scheduledCompactRev; bucket "lease" holds leasepb.Lease records. As etcd
// restores it, the compaction revision is the scheduled one when it is
// newer than the finished one, and the current revision the highest of the
// last version's, the compaction's and 1.
package snapimport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Config tunes an import.
type Config struct {
	// Path is the snapshot file.
	Path string
	// SkipHashCheck imports a snapshot without etcd's appended SHA-256 (a
	// member's db file copied by hand), as etcdutl's --skip-hash-check.
	SkipHashCheck bool
	Logger        *zap.Logger
	// Now is the clock leases' remaining TTLs count from; nil is time.Now.
	Now func() time.Time
	// BatchBytes bounds what one storage transaction writes; 0 means
	// mvcc's default (256 KiB).
	BatchBytes int
	// LeaseBatch bounds the leases one transaction writes; 0 means 500.
	LeaseBatch int
	// ProgressEvery is how often progress is logged; 0 means 5 s.
	ProgressEvery time.Duration
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.LeaseBatch <= 0 {
		c.LeaseBatch = 500
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 5 * time.Second
	}
	return c
}

// Result is what an import loaded.
type Result struct {
	Head, Compacted int64
	FirstRev        int64 // the lowest revision in the snapshot, 0 if it holds none
	Versions        int64 // versions written by this run (a resumed run skips the rest)
	Leases          int
	SHA256          string
}

// etcd's bucket and meta key names (server/storage/schema/bucket.go).
var (
	bucketKey       = []byte("key")
	bucketMeta      = []byte("meta")
	bucketLease     = []byte("lease")
	keyFinished     = []byte("finishedCompactRev")
	keyScheduled    = []byte("scheduledCompactRev")
	errNotSnapshot  = errors.New("snapimport: not an etcd v3 backend database (no key bucket)")
	errHashMismatch = errors.New("snapimport: snapshot hash mismatch")
)

// Import loads the snapshot at cfg.Path into db, which must be empty (or
// hold an interrupted import of the same snapshot, which it resumes), and
// publishes it.
func Import(ctx context.Context, db storage.DB, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	loader, res, err := Load(ctx, db, cfg)
	if err != nil {
		return res, err
	}
	if err := loader.Publish(ctx, res.State()); err != nil {
		return res, err
	}
	cfg.Logger.Info("snapshot imported", zap.Int64("revision", res.Head), zap.Int64("compact-revision", res.Compacted),
		zap.Int64("versions", res.Versions), zap.Int("leases", res.Leases))
	return res, nil
}

// State is what publishing the loaded snapshot makes visible.
func (r Result) State() mvcc.BulkState {
	return mvcc.BulkState{Head: r.Head, Compacted: r.Compacted, FirstRev: r.FirstRev}
}

// Load writes the snapshot's leases and versions into db without
// publishing them; the caller may add later revisions to the loader (a
// mirror does) before it publishes.
func Load(ctx context.Context, db storage.DB, cfg Config) (*mvcc.BulkLoader, Result, error) {
	cfg = cfg.withDefaults()
	sum, err := verifyHash(cfg.Path, cfg.SkipHashCheck, cfg.Logger)
	if err != nil {
		return nil, Result{}, err
	}
	bdb, err := bolt.Open(cfg.Path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, Result{}, fmt.Errorf("snapimport: open %s: %w", cfg.Path, err)
	}
	defer bdb.Close()
	res := Result{SHA256: hex.EncodeToString(sum)}
	var loader *mvcc.BulkLoader
	err = bdb.View(func(btx *bolt.Tx) error {
		loader, err = load(ctx, db, btx, cfg, sum, &res)
		return err
	})
	return loader, res, err
}

// verifyHash checks the SHA-256 etcd appends to a snapshot, as etcdutl's
// restore does: a file whose size is 32 more than a multiple of 512 carries
// one. It returns the hash of the database part, which names the snapshot.
func verifyHash(path string, skip bool, lg *zap.Logger) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	hasHash := size%512 == sha256.Size
	if !hasHash && !skip {
		return nil, fmt.Errorf("snapimport: snapshot missing hash but --skip-hash-check=false")
	}
	dbSize := size
	if hasHash {
		dbSize -= sha256.Size
	}
	lg.Info("hashing snapshot", zap.String("path", path), zap.Int64("bytes", dbSize))
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, dbSize)); err != nil {
		return nil, err
	}
	sum := h.Sum(nil)
	if hasHash && !skip {
		want := make([]byte, sha256.Size)
		if _, err := io.ReadFull(f, want); err != nil {
			return nil, err
		}
		if !bytes.Equal(want, sum) {
			return nil, fmt.Errorf("%w: expected sha256 %x, got %x", errHashMismatch, want, sum)
		}
	}
	return sum, nil
}

// snapState is what the snapshot says besides its versions.
type snapState struct {
	head, compacted, first int64
}

func readState(btx *bolt.Tx) (snapState, error) {
	kb := btx.Bucket(bucketKey)
	if kb == nil {
		return snapState{}, errNotSnapshot
	}
	st := snapState{compacted: -1}
	if mb := btx.Bucket(bucketMeta); mb != nil {
		for _, name := range [][]byte{keyFinished, keyScheduled} {
			if v := mb.Get(name); v != nil {
				if len(v) < 8 {
					return st, fmt.Errorf("snapimport: meta %s of %d bytes", name, len(v))
				}
				st.compacted = max(st.compacted, int64(binary.BigEndian.Uint64(v)))
			}
		}
	}
	c := kb.Cursor()
	if k, _ := c.First(); k != nil {
		first, err := parseRev(k)
		if err != nil {
			return st, err
		}
		last, _ := c.Last()
		lastRev, err := parseRev(last)
		if err != nil {
			return st, err
		}
		st.first, st.head = first.main, lastRev.main
	}
	st.head = max(st.head, st.compacted, 1)
	return st, nil
}

func load(ctx context.Context, db storage.DB, btx *bolt.Tx, cfg Config, sum []byte, res *Result) (*mvcc.BulkLoader, error) {
	st, err := readState(btx)
	if err != nil {
		return nil, err
	}
	res.Head, res.Compacted, res.FirstRev = st.head, st.compacted, st.first
	loader, cur, err := mvcc.BeginBulkLoad(ctx, db, mvcc.BulkLoadConfig{Source: sum, BatchBytes: cfg.BatchBytes})
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("importing snapshot", zap.String("sha256", res.SHA256), zap.Int64("revision", st.head),
		zap.Int64("compact-revision", st.compacted), zap.Int64("first-revision", st.first),
		zap.Bool("resumed", cur.Started))
	if res.Leases, err = loadLeases(ctx, db, btx.Bucket(bucketLease), cfg); err != nil {
		return nil, err
	}
	if res.Versions, err = loadVersions(ctx, loader, btx.Bucket(bucketKey), cur, st, cfg); err != nil {
		return nil, err
	}
	return loader, nil
}

// loadVersions writes the key bucket's versions after cur, in revision
// order, logging progress.
func loadVersions(ctx context.Context, loader *mvcc.BulkLoader, kb *bolt.Bucket, cur mvcc.BulkCursor, st snapState, cfg Config) (int64, error) {
	c := kb.Cursor()
	k, v := c.First()
	if cur.Started {
		k, v = c.Seek(revKey(cur.Rev, cur.Sub+1))
	}
	var n int64
	last := cfg.Now()
	for ; k != nil; k, v = c.Next() {
		lv, err := decodeVersion(k, v)
		if err != nil {
			return n, err
		}
		if err := loader.Add(ctx, lv); err != nil {
			return n, err
		}
		n++
		if now := cfg.Now(); now.Sub(last) >= cfg.ProgressEvery {
			last = now
			done := float64(lv.Rev-st.first+1) / float64(st.head-st.first+1)
			cfg.Logger.Info("import progress", zap.Int64("revision", lv.Rev), zap.Int64("of", st.head),
				zap.Int64("versions", n), zap.String("done", fmt.Sprintf("%.1f%%", 100*done)))
		}
	}
	return n, loader.Flush(ctx)
}

type rev struct{ main, sub int64 }

// parseRev reads an etcd revision key: 8-byte main, '_', 8-byte sub, and a
// 't' on a tombstone.
func parseRev(k []byte) (rev, error) {
	if (len(k) != 17 && len(k) != 18) || k[8] != '_' || (len(k) == 18 && k[17] != 't') {
		return rev{}, fmt.Errorf("snapimport: malformed revision key %x", k)
	}
	return rev{main: int64(binary.BigEndian.Uint64(k)), sub: int64(binary.BigEndian.Uint64(k[9:]))}, nil
}

func revKey(main, sub int64) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 17), uint64(main))
	k = append(k, '_')
	return binary.BigEndian.AppendUint64(k, uint64(sub))
}

func decodeVersion(k, v []byte) (mvcc.LoadedVersion, error) {
	r, err := parseRev(k)
	if err != nil {
		return mvcc.LoadedVersion{}, err
	}
	var kv mvccpb.KeyValue
	if err := proto.Unmarshal(v, &kv); err != nil {
		return mvcc.LoadedVersion{}, fmt.Errorf("snapimport: version %d_%d: %w", r.main, r.sub, err)
	}
	lv := mvcc.LoadedVersion{Key: kv.Key, Rev: r.main, Sub: r.sub, Tombstone: len(k) == 18}
	if !lv.Tombstone {
		if kv.ModRevision != r.main {
			return lv, fmt.Errorf("snapimport: version %d_%d of %q says mod revision %d", r.main, r.sub, kv.Key, kv.ModRevision)
		}
		lv.CreateRev, lv.Version, lv.Lease, lv.Value = kv.CreateRevision, kv.Version, kv.Lease, kv.Value
	}
	return lv, nil
}
