package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Bulk loading writes another etcd's history (an etcd snapshot's key
// bucket) into an empty keyspace, through the same encoders as the write
// path: for every version its history record (chunked), its revision's log
// events, the latest index and the lease attachments. Nothing of it is a
// revision a reader can see until Publish moves the head, and no server may
// run on the keyspace meanwhile (a server would see the latest index fill
// up at revision 1).
//
// Each transaction writes whole versions up to BulkLoadConfig.BatchBytes
// (one version when it alone is larger) and advances a cursor stored under
// bulkLoadMarker in the same transaction. The cursor makes a retried
// transaction (commit_unknown_result) recognise that it already landed, and
// lets an interrupted load resume where it stopped.

// LoadedVersion is one version of a key as the source etcd stored it.
type LoadedVersion struct {
	Key       []byte
	Rev, Sub  int64 // the revision that wrote it and its position in that revision
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
	Value     []byte
}

// BulkLoadConfig tunes a bulk load.
type BulkLoadConfig struct {
	// Source names what is being loaded (a snapshot's hash); an interrupted
	// load resumes only for the same source.
	Source []byte
	// BatchBytes bounds what one transaction writes; 0 means 256 KiB.
	BatchBytes int
}

// BulkCursor is how far a load got: every version up to (Rev, Sub) is
// written, and Parts log parts of revision Rev.
type BulkCursor struct {
	Rev, Sub int64
	Parts    int
	Started  bool // some version was written
}

// ErrNotEmpty refuses a bulk load into a keyspace that holds data.
var ErrNotEmpty = errors.New("mvcc: the keyspace is not empty")

// bulkLoadMarker holds the source and the cursor of a load in progress.
var bulkLoadMarker = keyspace.Singleton("mvcc/bulkload")

// BulkLoader writes versions in revision order. It is not safe for
// concurrent use.
type BulkLoader struct {
	db     storage.DB
	cfg    BulkLoadConfig
	cursor BulkCursor
	batch  []LoadedVersion
	bytes  int
}

// BeginBulkLoad starts a load into db, or resumes the interrupted load of
// the same source: it returns the cursor the caller skips to. A keyspace
// with any revision, key, version or lease, or with another source's load
// in progress, is refused with ErrNotEmpty.
func BeginBulkLoad(ctx context.Context, db storage.DB, cfg BulkLoadConfig) (*BulkLoader, BulkCursor, error) {
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = 256 << 10
	}
	var cur BulkCursor
	err := db.Update(ctx, func(tx storage.Tx) error {
		raw, err := tx.Get(bulkLoadMarker)
		if err != nil {
			return err
		}
		if raw != nil {
			src, c, err := decodeBulkMarker(raw)
			if err != nil {
				return err
			}
			if !bytes.Equal(src, cfg.Source) {
				return fmt.Errorf("%w: the load of another source was interrupted here", ErrNotEmpty)
			}
			cur = c
			return nil
		}
		if err := checkEmpty(tx); err != nil {
			return err
		}
		cur = BulkCursor{}
		tx.Set(bulkLoadMarker, encodeBulkMarker(cfg.Source, cur))
		return nil
	})
	if err != nil {
		return nil, BulkCursor{}, err
	}
	return &BulkLoader{db: db, cfg: cfg, cursor: cur}, cur, nil
}

// checkEmpty refuses a keyspace with a revision or any etcd data.
func checkEmpty(tx storage.ReadTx) error {
	h, err := revision.ReadHead(tx)
	if err != nil {
		return err
	}
	if h.Rev > 1 {
		return fmt.Errorf("%w: it is at revision %d", ErrNotEmpty, h.Rev)
	}
	latest, _ := keyspace.LatestRange(nil, nil)
	logFam := keyspace.LogFrom(0)[:1]
	leaseBegin, leaseEnd := keyspace.LeaseAll()
	histBegin, histEnd := keyspace.HistoryAll()
	for _, r := range [][2][]byte{
		{latest, storage.Strinc(latest[:1])}, {histBegin, histEnd},
		{logFam, storage.Strinc(logFam)}, {leaseBegin, leaseEnd},
	} {
		kvs, err := tx.GetRange(r[0], r[1], storage.RangeOptions{Limit: 1})
		if err != nil {
			return err
		}
		if len(kvs) > 0 {
			return fmt.Errorf("%w: it holds keys, versions or leases", ErrNotEmpty)
		}
	}
	return nil
}

// Add queues v, which must come after every version added before it in
// (Rev, Sub) order, and writes the queue once it holds BatchBytes.
func (b *BulkLoader) Add(ctx context.Context, v LoadedVersion) error {
	last := BulkCursor{Rev: b.cursor.Rev, Sub: b.cursor.Sub}
	if n := len(b.batch); n > 0 {
		last = BulkCursor{Rev: b.batch[n-1].Rev, Sub: b.batch[n-1].Sub}
	}
	if (b.cursor.Started || len(b.batch) > 0) && (v.Rev < last.Rev || v.Rev == last.Rev && v.Sub <= last.Sub) {
		return fmt.Errorf("mvcc: bulk load of %d_%d after %d_%d: versions must come in revision order", v.Rev, v.Sub, last.Rev, last.Sub)
	}
	if v.Rev < 1 || len(keyspace.History(v.Key, 0)) > storage.MaxKeySize || len(keyspace.Attach(0, v.Key)) > storage.MaxKeySize {
		return fmt.Errorf("mvcc: bulk load of %q at revision %d: %w", v.Key, v.Rev, ErrRequestTooLarge)
	}
	b.batch = append(b.batch, v)
	b.bytes += 5*len(v.Key) + len(v.Value) + 64
	if b.bytes >= b.cfg.BatchBytes {
		return b.Flush(ctx)
	}
	return nil
}

// Cursor is how far the load has written.
func (b *BulkLoader) Cursor() BulkCursor { return b.cursor }

// Flush writes the queued versions in one transaction.
func (b *BulkLoader) Flush(ctx context.Context) error {
	if len(b.batch) == 0 {
		return nil
	}
	return b.flush(ctx, 0)
}

// FlushHead writes the queued versions, which end revision head, and moves
// the head to it in the same transaction: a mirror publishes each revision
// it copies this way, while the load stays in progress.
func (b *BulkLoader) FlushHead(ctx context.Context, head int64) error {
	last := b.cursor.Rev
	if n := len(b.batch); n > 0 {
		last = b.batch[n-1].Rev
	}
	if last != head {
		return fmt.Errorf("mvcc: bulk load head %d is not the revision of the last version queued", head)
	}
	return b.flush(ctx, head)
}

func (b *BulkLoader) flush(ctx context.Context, head int64) error {
	var next BulkCursor
	err := b.db.Update(ctx, func(tx storage.Tx) error {
		raw, err := tx.Get(bulkLoadMarker)
		if err != nil {
			return err
		}
		src, stored, err := decodeBulkMarker(raw)
		if err != nil || !bytes.Equal(src, b.cfg.Source) {
			return fmt.Errorf("mvcc: bulk load marker gone or replaced (%v)", err)
		}
		if stored != b.cursor {
			// An earlier attempt of this transaction committed.
			next = stored
			return nil
		}
		next, err = writeLoaded(tx, b.cursor, b.batch)
		if err != nil {
			return err
		}
		tx.Set(bulkLoadMarker, encodeBulkMarker(b.cfg.Source, next))
		if head > 0 {
			tx.Set(keyspace.Head, revision.EncodeHead(revision.Head{Rev: head}))
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.cursor, b.batch, b.bytes = next, b.batch[:0], 0
	return nil
}

// writeLoaded writes batch on top of what cur says is written, as
// writeChanges writes a revision: the previous version of each key comes
// from the latest index (and the batch's own earlier versions).
func writeLoaded(tx storage.Tx, cur BulkCursor, batch []LoadedVersion) (BulkCursor, error) {
	latest, leases, err := readLoadState(tx, batch)
	if err != nil {
		return cur, err
	}
	var (
		rev    int64
		events []logEvent
	)
	flushLog := func() {
		if len(events) == 0 {
			return
		}
		var start []byte
		if cur.Parts == 0 {
			start = encodeLogHeader(revision.RequestID{})
		}
		for _, part := range encodeLogParts(start, events) {
			tx.Set(keyspace.Log(rev, cur.Parts), part)
			cur.Parts++
		}
		events = events[:0]
	}
	for _, v := range batch {
		if v.Rev != rev {
			flushLog()
			rev = v.Rev
			if v.Rev != cur.Rev {
				cur.Parts = 0
			}
		}
		prev := latest[string(v.Key)]
		events = append(events, writeLoadedVersion(tx, v, prev, leases[v.Lease]))
		m := meta{ModRev: v.Rev, CreateRev: v.CreateRev, Version: v.Version, Lease: v.Lease, Tombstone: v.Tombstone}
		if v.Tombstone {
			m = meta{ModRev: v.Rev, Tombstone: true}
		}
		latest[string(v.Key)] = &m
		cur.Rev, cur.Sub, cur.Started = v.Rev, v.Sub, true
	}
	flushLog()
	return cur, nil
}

// readLoadState reads the latest index entries of the batch's keys and
// whether each lease it names exists.
func readLoadState(tx storage.ReadTx, batch []LoadedVersion) (map[string]*meta, map[int64]bool, error) {
	latest := map[string]*meta{}
	var keys [][]byte
	for _, v := range batch {
		if _, ok := latest[string(v.Key)]; !ok {
			latest[string(v.Key)] = nil
			keys = append(keys, keyspace.Latest(v.Key))
		}
	}
	leases := map[int64]bool{}
	var ids []int64
	for _, v := range batch {
		if _, ok := leases[v.Lease]; !ok && v.Lease != 0 {
			leases[v.Lease] = false
			ids = append(ids, v.Lease)
			keys = append(keys, keyspace.Lease(v.Lease))
		}
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return nil, nil, err
	}
	for i, raw := range vals[:len(vals)-len(ids)] {
		if raw == nil {
			continue
		}
		m, err := decodeMeta(raw)
		if err != nil {
			return nil, nil, err
		}
		latest[string(keyspace.LatestKey(keys[i]))] = &m
	}
	for i, id := range ids {
		leases[id] = vals[len(vals)-len(ids)+i] != nil
	}
	return latest, leases, nil
}

// writeLoadedVersion writes one version's history, latest entry and lease
// attachment, and returns its log event. A key is attached to its lease only
// when the lease exists, as etcd's restore attaches only to leases it has.
func writeLoadedVersion(tx storage.Tx, v LoadedVersion, prev *meta, leaseExists bool) logEvent {
	ev := logEvent{Type: evPut, Sub: v.Sub, Key: v.Key}
	if prev != nil && !prev.Tombstone {
		ev.PrevRev = prev.ModRev
		if prev.Lease != 0 && (v.Tombstone || prev.Lease != v.Lease) {
			tx.Clear(keyspace.Attach(prev.Lease, v.Key))
		}
	}
	if v.Tombstone {
		ev.Type = evDelete
		tx.Set(keyspace.Latest(v.Key), encodeMeta(meta{ModRev: v.Rev, Tombstone: true}))
		tx.Set(keyspace.History(v.Key, v.Rev), encodeVersion(version{Sub: v.Sub, Tombstone: true, Chunks: 1}))
		return ev
	}
	m := meta{ModRev: v.Rev, CreateRev: v.CreateRev, Version: v.Version, Lease: v.Lease}
	tx.Set(keyspace.Latest(v.Key), encodeMeta(m))
	first, rest := splitValue(v.Value)
	tx.Set(keyspace.History(v.Key, v.Rev), encodeVersion(version{
		Sub: v.Sub, CreateRev: v.CreateRev, Version: v.Version, Lease: v.Lease,
		Chunks: 1 + len(rest), ValueLen: int64(len(v.Value)), First: first,
	}))
	for i, ch := range rest {
		tx.Set(keyspace.Chunk(v.Key, v.Rev, i+1), ch)
	}
	if v.Lease != 0 && leaseExists {
		tx.Set(keyspace.Attach(v.Lease, v.Key), nil)
	}
	return ev
}

// BulkState is what Publish makes visible.
type BulkState struct {
	// Head is the current revision; at least the last version's.
	Head int64
	// Compacted is the compaction revision, -1 for none.
	Compacted int64
	// FirstRev is the lowest revision loaded (0 if none). The versions
	// from FirstRev to Compacted that etcd's compaction at Compacted would
	// not keep are removed by the store's physical compaction once it runs.
	FirstRev int64
}

// Publish writes the queued versions, then the compaction state and the
// head, and ends the load. A retried attempt that finds the load already
// published succeeds.
func (b *BulkLoader) Publish(ctx context.Context, st BulkState) error {
	if err := b.Flush(ctx); err != nil {
		return err
	}
	if st.Head < max(b.cursor.Rev, 1) || st.Compacted > st.Head {
		return fmt.Errorf("mvcc: bulk load head %d below the last revision loaded %d or the compaction %d", st.Head, b.cursor.Rev, st.Compacted)
	}
	return b.db.Update(ctx, func(tx storage.Tx) error {
		raw, err := tx.Get(bulkLoadMarker)
		if err != nil {
			return err
		}
		if raw == nil {
			h, err := revision.ReadHead(tx)
			if err == nil && h.Rev != st.Head {
				err = fmt.Errorf("mvcc: bulk load marker gone, head at %d instead of %d", h.Rev, st.Head)
			}
			return err
		}
		if st.Compacted >= 0 {
			c := compaction{Requested: st.Compacted, Finished: st.Compacted, Part: partDone}
			if st.FirstRev > 0 && st.FirstRev <= st.Compacted {
				// Clean from the first revision: its log names every key
				// loaded at or below the compaction.
				c.Finished, c.Part = st.FirstRev, 0
			}
			tx.Set(keyspace.Compaction, encodeCompaction(c))
		}
		tx.Set(keyspace.Head, revision.EncodeHead(revision.Head{Rev: st.Head}))
		tx.Clear(bulkLoadMarker)
		return nil
	})
}

func encodeBulkMarker(src []byte, c BulkCursor) []byte {
	out := binary.AppendUvarint(nil, uint64(len(src)))
	out = append(out, src...)
	out = binary.AppendUvarint(out, uint64(c.Rev))
	out = binary.AppendUvarint(out, uint64(c.Sub))
	out = binary.AppendUvarint(out, uint64(c.Parts))
	if c.Started {
		return append(out, 1)
	}
	return append(out, 0)
}

func decodeBulkMarker(b []byte) ([]byte, BulkCursor, error) {
	if b == nil {
		return nil, BulkCursor{}, errors.New("mvcc: no bulk load in progress")
	}
	d := decoder{b: b}
	src := d.bytes(d.uvarint())
	c := BulkCursor{Rev: d.uvarint(), Sub: d.uvarint(), Parts: int(d.uvarint())}
	c.Started = d.byte1() == 1
	if d.err == nil && len(d.b) != 0 {
		d.err = errCorrupt
	}
	return src, c, d.err
}
