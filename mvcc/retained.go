package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// The history etcd retains: what an etcd store compacted at revision C holds
// at revision R — every version above C, plus each key's newest version at
// or below C unless it is a tombstone below C — whatever physical
// compaction has removed so far. HashKV hashes it; package snapshot writes
// it into an etcd backend database.

// ErrCompactionMoved: the compaction revision changed while the retained
// history was being walked; the walk must start again.
var ErrCompactionMoved = errors.New("mvcc: compacted during the walk")

// RetainedState is the revision, the compaction revision and the lease
// records of one point in the store's history.
type RetainedState struct {
	Rev       int64
	Compacted int64 // -1 for none
	Leases    []LeaseRecord
}

// LeaseRecord is a lease's stored record (package lease encodes it).
type LeaseRecord struct {
	ID     int64
	Record []byte
}

// RetainedVersion is one version of the retained history.
type RetainedVersion struct {
	// KV is the version; of a tombstone only Key and ModRevision are set.
	KV        *mvccpb.KeyValue
	Sub       int64 // its position among its revision's changes
	Tombstone bool
}

// RevisionKey is the version's key in etcd's key bucket: the revision
// (8-byte main, '_', 8-byte sub) and 't' for a tombstone.
func (v RetainedVersion) RevisionKey() []byte {
	k := make([]byte, 0, 18)
	k = binary.BigEndian.AppendUint64(k, uint64(v.KV.ModRevision))
	k = append(k, '_')
	k = binary.BigEndian.AppendUint64(k, uint64(v.Sub))
	if v.Tombstone {
		k = append(k, 't')
	}
	return k
}

// Marshal is the version's value in etcd's key bucket: the marshaled
// KeyValue, only the key for a tombstone.
func (v RetainedVersion) Marshal() ([]byte, error) {
	kv := v.KV
	if v.Tombstone {
		kv = &mvccpb.KeyValue{Key: v.KV.Key}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(kv)
}

// leasePageKeys bounds one read of lease records; snapshotPageKeys and
// snapshotPageBytes one page of history.
const (
	leasePageKeys     = 10_000
	snapshotPageKeys  = 1_000
	snapshotPageBytes = 8 << 20
)

// RetainedState reads the current revision, the compaction revision and
// every lease record in one transaction.
func (s *Store) RetainedState(ctx context.Context) (RetainedState, error) {
	var st RetainedState
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		h, c, err := readState(tx)
		if err != nil {
			return err
		}
		st = RetainedState{Rev: h.Rev, Compacted: c.Requested}
		begin, end := keyspace.LeaseAll()
		for {
			kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: leasePageKeys})
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				id, err := keyspace.ParseLease(kv.Key)
				if err != nil {
					return err
				}
				st.Leases = append(st.Leases, LeaseRecord{ID: id, Record: kv.Value})
			}
			if len(kvs) < leasePageKeys {
				return nil
			}
			begin = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
		}
	})
	return st, err
}

// WalkRetained calls emit with every version the history retains at rev
// when compacted at compacted, in key and then revision order. It reads in
// pages across storage transactions, all at rev, so that no transaction
// outlives the backend's limits; it fails with ErrCompactionMoved when the
// compaction revision moves from compacted meanwhile.
func (s *Store) WalkRetained(ctx context.Context, rev, compacted int64, emit func(RetainedVersion) error) error {
	w := historyWalk{s: s, rev: rev, compacted: compacted}
	return w.run(ctx, emit)
}

// historyWalk visits, in history-key order, the versions an etcd store
// compacted at compacted holds at rev.
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

func (sv snapVersion) retained() RetainedVersion {
	if sv.e.meta.Tombstone {
		return RetainedVersion{KV: &mvccpb.KeyValue{Key: sv.e.key, ModRevision: sv.e.meta.ModRev}, Sub: sv.sub, Tombstone: true}
	}
	return RetainedVersion{KV: sv.e.kv(true), Sub: sv.sub}
}

// run calls emit with each retained version.
func (w *historyWalk) run(ctx context.Context, emit func(RetainedVersion) error) error {
	begin, end := keyspace.HistoryAll()
	for begin != nil {
		var page walkPage
		err := w.s.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			page, err = w.readPage(tx, begin, end)
			return err
		})
		if err != nil {
			return err
		}
		w.cur, w.pending = page.cur, page.pending
		if err := emitAll(page.out, emit); err != nil {
			return err
		}
		begin = page.next
	}
	last := walkPage{pending: w.pending}
	last.flushPending(w.compacted)
	return emitAll(last.out, emit)
}

// walkPage is what one read transaction of the walk found: the versions to
// emit, the walk's key and pending version after them, and where the next
// page begins (nil at the end). It is taken into the walk only once the
// transaction has succeeded, so a retried transaction starts from the same
// state.
type walkPage struct {
	out     []snapVersion
	cur     []byte
	pending *snapVersion
	next    []byte
}

// readPage reads the page of history that starts at begin and decides
// which of its versions are retained, with their values.
func (w *historyWalk) readPage(tx storage.ReadTx, begin, end []byte) (walkPage, error) {
	page := walkPage{cur: w.cur, pending: w.pending}
	_, c, err := readState(tx)
	if err != nil {
		return page, err
	}
	if c.Requested != w.compacted {
		return page, ErrCompactionMoved
	}
	kvs, err := snapshotPage(tx, begin, end)
	if err != nil {
		return page, err
	}
	for _, kv := range kvs {
		if err := w.add(&page, kv); err != nil {
			return page, err
		}
	}
	if len(kvs) > 0 && (len(kvs) == snapshotPageKeys || snapshotPageFull(kvs)) {
		page.next = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
	}
	return page, resolveValues(tx, page.toResolve())
}

// add decides on one history entry: a version newer than the walk's
// revision is not there yet; one at or below compacted is pending until the
// key's next version says whether it is kept; the others are kept.
func (w *historyWalk) add(page *walkPage, kv storage.KeyValue) error {
	key, modRev, err := keyspace.ParseHistory(kv.Key)
	if err != nil || modRev > w.rev {
		return err
	}
	v, err := decodeVersion(kv.Value)
	if err != nil {
		return err
	}
	if !bytes.Equal(key, page.cur) {
		page.flushPending(w.compacted)
		page.cur = key
	}
	sv := snapVersion{e: &entry{key: key, meta: v.Meta(modRev), ver: &v}, sub: v.Sub}
	if modRev <= w.compacted {
		// Superseded by any newer version at or below compacted.
		page.pending = &sv
		return nil
	}
	page.flushPending(w.compacted)
	page.out = append(page.out, sv)
	return nil
}

// toResolve is the entries whose values the page must read: those it emits
// and the pending one, which this transaction sees, not tombstones.
func (page *walkPage) toResolve() []*entry {
	var resolve []*entry
	for _, sv := range page.out {
		if !sv.e.meta.Tombstone {
			resolve = append(resolve, sv.e)
		}
	}
	if page.pending != nil && !page.pending.e.meta.Tombstone {
		resolve = append(resolve, page.pending.e)
	}
	return resolve
}

// flushPending ends the current key's versions at or below compacted: etcd
// 3.6 keeps the newest of them unless it is a tombstone below compacted (its
// keyIndex.compact keeps a tombstone at the compaction revision itself).
func (page *walkPage) flushPending(compacted int64) {
	if p := page.pending; p != nil && (!p.e.meta.Tombstone || p.e.meta.ModRev == compacted) {
		page.out = append(page.out, *p)
	}
	page.pending = nil
}

func emitAll(out []snapVersion, emit func(RetainedVersion) error) error {
	for _, sv := range out {
		if err := emit(sv.retained()); err != nil {
			return err
		}
	}
	return nil
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
