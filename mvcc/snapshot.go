package mvcc

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
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// SnapshotConfig is what an etcd backend database holds besides the key
// history and the leases, and how to read fdb-etcd's lease records.
type SnapshotConfig struct {
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

// SnapshotFile is a point-in-time etcd v3.6 backend database (a bbolt file
// with etcd's schema) built on disk. Read it once; Close removes it.
type SnapshotFile struct {
	Rev        int64 // the revision it holds
	CompactRev int64 // the compaction revision it records, -1 for none
	Size       int64 // bytes Read returns
	Versions   int   // entries in the key bucket
	f          *os.File
}

// Read reads the database file.
func (f *SnapshotFile) Read(p []byte) (int, error) { return f.f.Read(p) }

// Close closes and removes the database file.
func (f *SnapshotFile) Close() error {
	err := f.f.Close()
	if rerr := os.Remove(f.f.Name()); err == nil {
		err = rerr
	}
	return err
}

// Snapshotter is a store bound to a SnapshotConfig, for services that only
// ask for a database and its size.
type Snapshotter struct {
	s   *Store
	cfg SnapshotConfig
}

// Snapshotter binds cfg to s.
func (s *Store) Snapshotter(cfg SnapshotConfig) Snapshotter { return Snapshotter{s: s, cfg: cfg} }

// OpenSnapshot builds a snapshot and returns it with its size.
func (sn Snapshotter) OpenSnapshot(ctx context.Context) (io.ReadCloser, int64, error) {
	f, err := sn.s.OpenSnapshot(ctx, sn.cfg)
	if err != nil {
		return nil, 0, err
	}
	return f, f.Size, nil
}

// errSnapshotCompacted restarts a snapshot whose compaction revision moved
// while it was being read.
var errSnapshotCompacted = errors.New("mvcc: compacted during snapshot")

// snapshotAttempts bounds the restarts caused by concurrent compactions.
const snapshotAttempts = 5

// OpenSnapshot builds a point-in-time etcd v3.6 backend database in a
// temporary file: the retained key history at the current revision R,
// compacted exactly as etcd's bbolt file is after compacting at the
// compaction revision C (every version above C, plus each key's newest
// version at or below C unless it is a tombstone below C), whatever the
// physical compaction has removed so far, the leases that exist at
// R, and etcd's meta, cluster, membership, alarm and auth buckets with auth
// disabled. The history is read in pages across storage transactions, all at
// R, so that no transaction outlives the backend's limits.
func (s *Store) OpenSnapshot(ctx context.Context, cfg SnapshotConfig) (*SnapshotFile, error) {
	for attempt := 1; ; attempt++ {
		f, err := s.buildSnapshot(ctx, cfg)
		if errors.Is(err, errSnapshotCompacted) && attempt < snapshotAttempts {
			continue
		}
		if errors.Is(err, errSnapshotCompacted) {
			err = ErrCompacted
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

// snapLease is one lease record read at the snapshot's revision.
type snapLease struct {
	id  int64
	rec []byte
}

// snapshotPageKeys and snapshotPageBytes bound one history page.
const (
	snapshotPageKeys  = 1_000
	snapshotPageBytes = 8 << 20
	// snapshotCommitBytes bounds the bbolt transactions the file is built in.
	snapshotCommitBytes = 32 << 20
)

func (s *Store) buildSnapshot(ctx context.Context, cfg SnapshotConfig) (_ *SnapshotFile, err error) {
	// The revision, the compaction and the leases, from one transaction.
	var (
		rev, compacted int64
		leases         []snapLease
	)
	err = s.db.View(ctx, func(tx storage.ReadTx) error {
		leases = nil
		h, c, err := readState(tx)
		if err != nil {
			return err
		}
		rev, compacted = h.Rev, c.Requested
		begin, end := keyspace.LeaseAll()
		for {
			kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: 10_000})
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				id, err := keyspace.ParseLease(kv.Key)
				if err != nil {
					return err
				}
				leases = append(leases, snapLease{id: id, rec: kv.Value})
			}
			if len(kvs) < 10_000 {
				return nil
			}
			begin = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
		}
	})
	if err != nil {
		return nil, err
	}
	if len(leases) > 0 && cfg.LeaseTTL == nil {
		return nil, fmt.Errorf("mvcc: snapshot of %d leases needs SnapshotConfig.LeaseTTL", len(leases))
	}

	tmp, err := os.CreateTemp(cfg.Dir, "fdb-etcd-snapshot-*.db")
	if err != nil {
		return nil, err
	}
	path := tmp.Name()
	tmp.Close()
	var db *bolt.DB
	defer func() {
		if db != nil {
			db.Close()
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return writeSnapshotMeta(tx, cfg, rev, compacted, leases)
	}); err != nil {
		return nil, err
	}

	versions := 0
	w := &boltBatch{db: db}
	walk := historyWalk{s: s, rev: rev, compacted: compacted}
	err = walk.run(ctx, func(_, k, v []byte) error {
		versions++
		return w.put(k, v)
	})
	if err == nil {
		err = w.flush()
	}
	if err != nil {
		return nil, err
	}

	// Trim the file to the pages in use, as a bbolt Tx.WriteTo would copy.
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		return nil, err
	}
	if err := db.Close(); err != nil {
		db = nil
		return nil, err
	}
	db = nil
	if err := os.Truncate(path, size); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return &SnapshotFile{Rev: rev, CompactRev: compacted, Size: size, Versions: versions, f: f}, nil
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
	if b.bytes >= snapshotCommitBytes || len(b.items) >= 50_000 {
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

// historyWalk visits, in history-key order, the versions an etcd bbolt file
// compacted at compacted holds at rev, as etcd's revision keys and marshaled
// KeyValues (the same encoding HashKV hashes).
type historyWalk struct {
	s              *Store
	rev, compacted int64

	// The key being walked and its newest version at or below compacted seen
	// so far, carried across pages: whether it is kept depends on the key's
	// next version, which may be on the next page.
	cur     []byte
	pending *snapVersion
}

type snapVersion struct {
	e   *entry
	sub int64
}

// run calls emit with each version's etcd key, revision key and value.
func (w *historyWalk) run(ctx context.Context, emit func(key, k, v []byte) error) error {
	begin, end := keyspace.HistoryAll()
	for begin != nil {
		cur0, pending0 := w.cur, w.pending
		var (
			out  []snapVersion
			next []byte
		)
		err := w.s.db.View(ctx, func(tx storage.ReadTx) error {
			w.cur, w.pending, out, next = cur0, pending0, nil, nil
			_, c, err := readState(tx)
			if err != nil {
				return err
			}
			if c.Requested != w.compacted {
				return errSnapshotCompacted
			}
			kvs, err := snapshotPage(tx, begin, end)
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				key, modRev, err := keyspace.ParseHistory(kv.Key)
				if err != nil {
					return err
				}
				if modRev > w.rev {
					continue
				}
				v, err := decodeVersion(kv.Value)
				if err != nil {
					return err
				}
				if !bytes.Equal(key, w.cur) {
					out = w.flushPending(out)
					w.cur = key
				}
				sv := snapVersion{e: &entry{key: key, meta: v.meta(modRev), ver: &v}, sub: v.Sub}
				if modRev <= w.compacted {
					// Superseded by any newer version at or below compacted.
					w.pending = &sv
					continue
				}
				out = w.flushPending(out)
				out = append(out, sv)
			}
			if len(kvs) > 0 && (len(kvs) == snapshotPageKeys || snapshotPageFull(kvs)) {
				next = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
			}
			var resolve []*entry
			for _, sv := range out {
				if !sv.e.meta.Tombstone {
					resolve = append(resolve, sv.e)
				}
			}
			if w.pending != nil && !w.pending.e.meta.Tombstone {
				// Read its value now: this transaction sees it.
				resolve = append(resolve, w.pending.e)
			}
			return resolveValues(tx, resolve)
		})
		if err != nil {
			return err
		}
		for _, sv := range out {
			k, v, err := etcdRevisionKV(sv)
			if err != nil {
				return err
			}
			if err := emit(sv.e.key, k, v); err != nil {
				return err
			}
		}
		begin = next
	}
	for _, sv := range w.flushPending(nil) {
		k, v, err := etcdRevisionKV(sv)
		if err != nil {
			return err
		}
		if err := emit(sv.e.key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// flushPending ends the current key's versions at or below compacted: etcd
// 3.6 keeps the newest of them unless it is a tombstone below compacted (its
// keyIndex.compact keeps a tombstone at the compaction revision itself).
func (w *historyWalk) flushPending(out []snapVersion) []snapVersion {
	if p := w.pending; p != nil && (!p.e.meta.Tombstone || p.e.meta.ModRev == w.compacted) {
		out = append(out, *p)
	}
	w.pending = nil
	return out
}

// snapshotPage reads up to snapshotPageKeys history entries, stopping early
// once they hold snapshotPageBytes.
func snapshotPage(tx storage.ReadTx, begin, end []byte) ([]storage.KeyValue, error) {
	var kvs []storage.KeyValue
	n := 0
	err := storage.Scan(tx, begin, end, snapshotPageKeys, func(k, v []byte) bool {
		kvs = append(kvs, storage.KeyValue{Key: bytes.Clone(k), Value: bytes.Clone(v)})
		n += len(k) + len(v)
		return n < snapshotPageBytes
	})
	return kvs, err
}

func snapshotPageFull(kvs []storage.KeyValue) bool {
	n := 0
	for _, kv := range kvs {
		n += len(kv.Key) + len(kv.Value)
	}
	return n >= snapshotPageBytes
}

// etcdRevisionKV is a version as etcd's key bucket stores it: the revision
// (8-byte main, '_', 8-byte sub, 't' for a tombstone) and the marshaled
// KeyValue (only the key for a tombstone).
func etcdRevisionKV(sv snapVersion) (k, v []byte, err error) {
	k = make([]byte, 0, 18)
	k = binary.BigEndian.AppendUint64(k, uint64(sv.e.meta.ModRev))
	k = append(k, '_')
	k = binary.BigEndian.AppendUint64(k, uint64(sv.sub))
	kv := &mvccpb.KeyValue{Key: sv.e.key}
	if sv.e.meta.Tombstone {
		k = append(k, 't')
	} else {
		kv = sv.e.kv(true)
	}
	v, err = proto.MarshalOptions{Deterministic: true}.Marshal(kv)
	return k, v, err
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
	snapStorageVersion = "3.6.0"
	snapClusterVersion = "3.6.0"
)

// writeSnapshotMeta creates etcd's buckets and fills all but the key bucket.
func writeSnapshotMeta(tx *bolt.Tx, cfg SnapshotConfig, rev, compacted int64, leases []snapLease) error {
	bks := map[string]*bolt.Bucket{}
	for _, name := range [][]byte{bucketKey, bucketMeta, bucketLease, bucketAlarm, bucketCluster,
		bucketMembers, bucketMembersRemoved, bucketAuth, bucketAuthUsers, bucketAuthRoles} {
		b, err := tx.CreateBucket(name)
		if err != nil {
			return err
		}
		bks[string(name)] = b
	}
	put := func(bucket []byte, k, v []byte) error { return bks[string(bucket)].Put(k, v) }

	term := cfg.Term
	if term == 0 {
		term = 1
	}
	type kv struct {
		k string
		v []byte
	}
	meta := []kv{
		{"consistent_index", u64(uint64(rev))},
		{"term", u64(term)},
		{"storageVersion", []byte(snapStorageVersion)},
	}
	if compacted >= 0 {
		meta = append(meta, kv{"scheduledCompactRev", etcdRev(compacted)}, kv{"finishedCompactRev", etcdRev(compacted)})
	}
	if cfg.MemberID != 0 {
		cs, err := json.Marshal(struct {
			Voters    []uint64 `json:"voters,omitempty"`
			AutoLeave bool     `json:"auto_leave"`
		}{Voters: []uint64{cfg.MemberID}})
		if err != nil {
			return err
		}
		meta = append(meta, kv{"confState", cs})
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
		if err := put(bucketMembers, []byte(strconv.FormatUint(cfg.MemberID, 16)), m); err != nil {
			return err
		}
	}
	for _, m := range meta {
		if err := put(bucketMeta, []byte(m.k), m.v); err != nil {
			return err
		}
	}
	if err := put(bucketCluster, []byte("clusterVersion"), []byte(snapClusterVersion)); err != nil {
		return err
	}
	// Auth never enabled: etcd writes no authEnabled key, and revision 1.
	if err := put(bucketAuth, []byte("authRevision"), u64(1)); err != nil {
		return err
	}
	for _, l := range leases {
		ttl, remaining, err := cfg.LeaseTTL(l.rec)
		if err != nil {
			return fmt.Errorf("lease %x: %w", l.id, err)
		}
		// etcd restores a lease with RemainingTTL when it is positive and
		// with its full TTL otherwise; an overdue lease keeps one second.
		remaining = max(min(remaining, ttl), 1)
		if err := put(bucketLease, u64(uint64(l.id)), encodeEtcdLease(l.id, ttl, remaining)); err != nil {
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
