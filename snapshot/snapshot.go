// Package snapshot writes an etcd v3.6 backend database — a bbolt file with
// etcd's schema and bucket names — from an mvcc store's retained history,
// for the Maintenance Snapshot RPC: what etcdutl snapshot restore and
// etcd itself read back.
package snapshot

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// Config is what an etcd backend database holds besides the key history
// and the leases, and how to read fdb-etcd's lease records.
type Config struct {
	// The member written to the members bucket and the meta bucket's
	// confState (etcdutl's restore replaces the membership anyway).
	MemberID   uint64
	MemberName string
	PeerURLs   []string
	ClientURLs []string
	// Term is the raft term recorded with the consistent index; 0 means 1.
	Term uint64
	// LeaseTTL decodes a stored lease record into its granted TTL and the
	// seconds it has left. Required when any lease exists.
	LeaseTTL func(record []byte) (ttl, remaining int64, err error)
	// Dir holds the temporary database file; "" means os.TempDir().
	Dir string
}

// Source is the store a snapshot reads: *mvcc.Store.
type Source interface {
	RetainedState(ctx context.Context) (mvcc.RetainedState, error)
	WalkRetained(ctx context.Context, rev, compacted int64, emit func(mvcc.RetainedVersion) error) error
}

// File is a point-in-time etcd v3.6 backend database built on disk. Read
// it once; Close removes it.
type File struct {
	Rev        int64 // the revision it holds
	CompactRev int64 // the compaction revision it records, -1 for none
	Size       int64 // bytes Read returns
	Versions   int   // entries in the key bucket
	f          *os.File
}

// Read reads the database file.
func (f *File) Read(p []byte) (int, error) { return f.f.Read(p) }

// Close closes and removes the database file.
func (f *File) Close() error {
	err := f.f.Close()
	if rerr := os.Remove(f.f.Name()); err == nil {
		err = rerr
	}
	return err
}

// Snapshotter is a store bound to a Config, for services that only ask for
// a database and its size (maintenance.Snapshotter).
type Snapshotter struct {
	src Source
	cfg Config
}

// New binds cfg to src.
func New(src Source, cfg Config) Snapshotter { return Snapshotter{src: src, cfg: cfg} }

// OpenSnapshot builds a snapshot and returns it with its size.
func (sn Snapshotter) OpenSnapshot(ctx context.Context) (io.ReadCloser, int64, error) {
	f, err := Open(ctx, sn.src, sn.cfg)
	if err != nil {
		return nil, 0, err
	}
	return f, f.Size, nil
}

// attempts bounds the restarts caused by concurrent compactions.
const attempts = 5

// Open builds a point-in-time etcd v3.6 backend database in a temporary
// file: the history retained at the current revision R under the
// compaction revision C (mvcc.Store.WalkRetained), compacted exactly as
// etcd's bbolt file is after compacting at C, the leases that exist at R,
// and etcd's meta, cluster, membership, alarm and auth buckets with auth
// disabled. A compaction while it reads starts it again; after attempts
// restarts it fails with mvcc.ErrCompacted.
func Open(ctx context.Context, src Source, cfg Config) (*File, error) {
	for attempt := 1; ; attempt++ {
		f, err := build(ctx, src, cfg)
		if errors.Is(err, mvcc.ErrCompactionMoved) && attempt < attempts {
			continue
		}
		if errors.Is(err, mvcc.ErrCompactionMoved) {
			err = mvcc.ErrCompacted
		}
		return f, err
	}
}

// etcd's bucket names (server/storage/schema).
var (
	bucketKey            = []byte("key")
	bucketMeta           = []byte("meta")
	bucketLease          = []byte("lease")
	bucketAlarm          = []byte("alarm")
	bucketCluster        = []byte("cluster")
	bucketMembers        = []byte("members")
	bucketMembersRemoved = []byte("members_removed")
	bucketAuth           = []byte("auth")
	bucketAuthUsers      = []byte("authUsers")
	bucketAuthRoles      = []byte("authRoles")
)

// commitBytes and commitItems bound the bbolt transactions the file is
// built in.
const (
	commitBytes = 32 << 20
	commitItems = 50_000
)

// build writes one attempt's database: the state and leases, then the
// retained history, then the file trimmed to the pages in use.
func build(ctx context.Context, src Source, cfg Config) (*File, error) {
	st, err := src.RetainedState(ctx)
	if err != nil {
		return nil, err
	}
	if len(st.Leases) > 0 && cfg.LeaseTTL == nil {
		return nil, fmt.Errorf("snapshot: %d leases need Config.LeaseTTL", len(st.Leases))
	}
	db, path, err := create(cfg, st)
	if err != nil {
		return nil, err
	}
	versions, err := writeHistory(ctx, src, st, db)
	if err == nil {
		var f *File
		f, err = finish(db, path)
		if err == nil {
			f.Rev, f.CompactRev, f.Versions = st.Rev, st.Compacted, versions
			return f, nil
		}
	} else {
		db.Close()
	}
	os.Remove(path)
	return nil, err
}

// create makes the database file with etcd's buckets, all but the key
// bucket filled.
func create(cfg Config, st mvcc.RetainedState) (*bolt.DB, string, error) {
	tmp, err := os.CreateTemp(cfg.Dir, "fdb-etcd-snapshot-*.db")
	if err != nil {
		return nil, "", err
	}
	path := tmp.Name()
	tmp.Close()
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		os.Remove(path)
		return nil, "", err
	}
	if err := db.Update(func(tx *bolt.Tx) error { return writeMeta(tx, cfg, st) }); err != nil {
		db.Close()
		os.Remove(path)
		return nil, "", err
	}
	return db, path, nil
}

// writeHistory fills the key bucket with the retained history and returns
// the versions written.
func writeHistory(ctx context.Context, src Source, st mvcc.RetainedState, db *bolt.DB) (int, error) {
	versions := 0
	w := &boltBatch{db: db}
	err := src.WalkRetained(ctx, st.Rev, st.Compacted, func(rv mvcc.RetainedVersion) error {
		v, err := rv.Marshal()
		if err != nil {
			return err
		}
		versions++
		return w.put(rv.RevisionKey(), v)
	})
	if err != nil {
		return 0, err
	}
	return versions, w.flush()
}

// finish closes db and trims its file to the pages in use, as a bbolt
// Tx.WriteTo would copy, and opens it for reading. It closes db whatever
// happens.
func finish(db *bolt.DB, path string) (*File, error) {
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	if err := os.Truncate(path, size); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &File{Size: size, f: f}, nil
}

// boltBatch writes key-bucket entries in bounded bbolt transactions, each
// batch in revision order.
type boltBatch struct {
	db    *bolt.DB
	items []snapItem
	bytes int
}

type snapItem struct{ k, v []byte }

func (b *boltBatch) put(k, v []byte) error {
	b.items = append(b.items, snapItem{k: k, v: v})
	b.bytes += len(k) + len(v)
	if b.bytes >= commitBytes || len(b.items) >= commitItems {
		return b.flush()
	}
	return nil
}

func (b *boltBatch) flush() error {
	if len(b.items) == 0 {
		return nil
	}
	sort.Slice(b.items, func(i, j int) bool { return bytes.Compare(b.items[i].k, b.items[j].k) < 0 })
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketKey)
		for _, it := range b.items {
			if err := bk.Put(it.k, it.v); err != nil {
				return err
			}
		}
		return nil
	})
	b.items, b.bytes = b.items[:0], 0
	return err
}

// etcdRev is a main revision as etcd's meta bucket stores compaction
// revisions: a revision key with sub 0.
func etcdRev(main int64) []byte {
	out := binary.BigEndian.AppendUint64(make([]byte, 0, 17), uint64(main))
	out = append(out, '_')
	return binary.BigEndian.AppendUint64(out, 0)
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// storageVersion and clusterVersion are what etcd 3.6 records.
const (
	storageVersion = "3.6.0"
	clusterVersion = "3.6.0"
)

// writeMeta creates etcd's buckets and fills all but the key bucket.
func writeMeta(tx *bolt.Tx, cfg Config, st mvcc.RetainedState) error {
	for _, name := range [][]byte{bucketKey, bucketMeta, bucketLease, bucketAlarm, bucketCluster,
		bucketMembers, bucketMembersRemoved, bucketAuth, bucketAuthUsers, bucketAuthRoles} {
		if _, err := tx.CreateBucket(name); err != nil {
			return err
		}
	}
	meta, err := metaEntries(cfg, st)
	if err != nil {
		return err
	}
	for _, m := range meta {
		if err := tx.Bucket(bucketMeta).Put([]byte(m.k), m.v); err != nil {
			return err
		}
	}
	if err := writeMember(tx, cfg); err != nil {
		return err
	}
	if err := tx.Bucket(bucketCluster).Put([]byte("clusterVersion"), []byte(clusterVersion)); err != nil {
		return err
	}
	// Auth never enabled: etcd writes no authEnabled key, and revision 1.
	if err := tx.Bucket(bucketAuth).Put([]byte("authRevision"), u64(1)); err != nil {
		return err
	}
	return writeLeases(tx, cfg, st.Leases)
}

type metaEntry struct {
	k string
	v []byte
}

// metaEntries is the meta bucket: the consistent index and term, the
// storage version, the compaction revisions and the raft conf state.
func metaEntries(cfg Config, st mvcc.RetainedState) ([]metaEntry, error) {
	term := cfg.Term
	if term == 0 {
		term = 1
	}
	meta := []metaEntry{
		{"consistent_index", u64(uint64(st.Rev))},
		{"term", u64(term)},
		{"storageVersion", []byte(storageVersion)},
	}
	if st.Compacted >= 0 {
		meta = append(meta, metaEntry{"scheduledCompactRev", etcdRev(st.Compacted)}, metaEntry{"finishedCompactRev", etcdRev(st.Compacted)})
	}
	if cfg.MemberID != 0 {
		cs, err := json.Marshal(struct {
			Voters    []uint64 `json:"voters,omitempty"`
			AutoLeave bool     `json:"auto_leave"`
		}{Voters: []uint64{cfg.MemberID}})
		if err != nil {
			return nil, err
		}
		meta = append(meta, metaEntry{"confState", cs})
	}
	return meta, nil
}

// writeMember fills the members bucket with the configured member, if any.
func writeMember(tx *bolt.Tx, cfg Config) error {
	if cfg.MemberID == 0 {
		return nil
	}
	peer := cfg.PeerURLs
	if peer == nil {
		peer = []string{}
	}
	m, err := json.Marshal(struct {
		ID         uint64   `json:"id"`
		PeerURLs   []string `json:"peerURLs"`
		Name       string   `json:"name,omitempty"`
		ClientURLs []string `json:"clientURLs,omitempty"`
	}{ID: cfg.MemberID, PeerURLs: peer, Name: cfg.MemberName, ClientURLs: cfg.ClientURLs})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketMembers).Put([]byte(strconv.FormatUint(cfg.MemberID, 16)), m)
}

// writeLeases fills the lease bucket.
func writeLeases(tx *bolt.Tx, cfg Config, leases []mvcc.LeaseRecord) error {
	for _, l := range leases {
		ttl, remaining, err := cfg.LeaseTTL(l.Record)
		if err != nil {
			return fmt.Errorf("lease %x: %w", l.ID, err)
		}
		// etcd restores a lease with RemainingTTL when it is positive and
		// with its full TTL otherwise; an overdue lease keeps one second.
		remaining = max(min(remaining, ttl), 1)
		if err := tx.Bucket(bucketLease).Put(u64(uint64(l.ID)), encodeEtcdLease(l.ID, ttl, remaining)); err != nil {
			return err
		}
	}
	return nil
}

// encodeEtcdLease marshals etcd's leasepb.Lease{ID: 1, TTL: 2,
// RemainingTTL: 3}, all int64, omitting zeros as gogoproto does.
func encodeEtcdLease(id, ttl, remaining int64) []byte {
	var b []byte
	for i, v := range []int64{id, ttl, remaining} {
		if v != 0 {
			b = protowire.AppendTag(b, protowire.Number(i+1), protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	return b
}
