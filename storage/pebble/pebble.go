// Package pebble is the embedded storage backend: a single-node Pebble store
// in a local directory, the default that needs nothing else installed.
//
// Writers are serialised by a mutex, so an indexed batch read through to the
// live database is serializable; every commit is synced to the WAL before
// Update returns, so an acknowledged write survives a crash. Views run on
// Pebble snapshots.
package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Options tune the store. The zero value is usable.
type Options struct {
	// FS replaces the real filesystem, for crash-simulation tests.
	FS vfs.FS
	// CacheBytes is the block cache size; 0 means 256 MiB.
	CacheBytes int64
	// NoSync skips the WAL fsync (--unsafe-no-fsync): a crash of the
	// machine can lose acknowledged writes.
	NoSync bool
}

// DB is the Pebble backend.
type DB struct {
	db *pebble.DB

	writeMu sync.Mutex // serialises Update up to its commit's visibility, not its WAL sync

	// A commit wakes only the WaitChange calls on the keys it wrote: many
	// keyspaces share one store (package tenant), and waking every waiter
	// on every commit made each tenant's writes cost a read per waiter of
	// every other tenant.
	notifyMu sync.Mutex
	waiting  map[string]*keyWait // guarded by notifyMu: the keys WaitChange waits on

	// Every use of db is bracketed by enter/leave so that Close waits for
	// in-flight calls instead of closing Pebble under them (Pebble panics on
	// use after Close), and calls that start after Close fail with ErrClosed.
	lifeMu   sync.Mutex
	isClosed bool
	inflight sync.WaitGroup

	closeOnce sync.Once
	closed    chan struct{} // closed by Close; wakes WaitChange
	sync      *pebble.WriteOptions
}

// keyWait is the waiters of one key: ch is closed (and the entry removed)
// by the first commit that writes the key.
type keyWait struct {
	ch chan struct{}
	n  int // guarded by DB.notifyMu: WaitChange calls holding ch
}

var (
	_ storage.DB         = (*DB)(nil)
	_ storage.Sizer      = (*DB)(nil)
	_ storage.RangeSizer = (*DB)(nil)
	_ storage.Scanner    = (*tx)(nil)
)

// memTableSize is Pebble's largest memtable; a WAL holds about one
// memtable's worth of batches, so WAL files are allocated up to it.
const memTableSize = 64 << 20

// Open opens (creating if needed) the store in dir.
func Open(dir string, o Options) (*DB, error) {
	cacheBytes := o.CacheBytes
	if cacheBytes == 0 {
		cacheBytes = 256 << 20
	}
	cache := pebble.NewCache(cacheBytes)
	defer cache.Unref()
	fs := o.FS
	if fs == nil {
		fs = vfs.Default
	}
	po := &pebble.Options{
		Cache:                       cache,
		FS:                          walPreallocFS{FS: fs, allocate: fallocateSize},
		MemTableSize:                memTableSize,
		MemTableStopWritesThreshold: 4,
		CompactionConcurrencyRange:  func() (int, int) { return 1, 2 },
		Logger:                      quietLogger{},
		FormatMajorVersion:          pebble.FormatNewest,
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open pebble store in %s: %w", dir, err)
	}
	s := &DB{db: db, waiting: map[string]*keyWait{}, closed: make(chan struct{}), sync: pebble.Sync}
	if o.NoSync {
		s.sync = pebble.NoSync
	}
	return s, nil
}

// Update runs fn in a serialised read-write transaction and commits it durably.
func (s *DB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	for {
		err := s.updateOnce(ctx, fn)
		if err == nil || !storage.Retryable(err) {
			return err
		}
	}
}

func (s *DB) updateOnce(ctx context.Context, fn func(storage.Tx) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave() // deferred: a panicking fn must not leave Close waiting
	b := s.db.NewIndexedBatch()
	defer b.Close()
	t := &tx{r: b, b: b}
	committed, syncWait, err := s.apply(b, t, fn)
	if err != nil || !committed {
		return err
	}
	// The commit is visible (Pebble publishes a batch before its WAL sync
	// in any case) but not yet durable. Waiting for the sync outside
	// writeMu lets the next Update run and join the same sync instead of
	// queueing behind it: without that, every keyspace on the store
	// (tenants, the lessor) waited for each other's fsyncs one at a time.
	if syncWait {
		if err := b.SyncWait(); err != nil {
			return fmt.Errorf("pebble commit: %w", err)
		}
	}
	s.wake(t)
	return nil
}

// apply runs fn and applies its writes, if any (committed), holding
// writeMu: Updates are serialised from their first read to their writes
// becoming visible. syncWait says the caller must wait for the WAL sync
// (b.SyncWait) before the writes are durable.
func (s *DB) apply(b *pebble.Batch, t *tx, fn func(storage.Tx) error) (committed, syncWait bool, err error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := fn(t); err != nil {
		return false, false, err
	}
	if b.Empty() {
		return false, false, nil
	}
	if !s.sync.Sync {
		if err := b.Commit(s.sync); err != nil {
			return false, false, fmt.Errorf("pebble commit: %w", err)
		}
		return true, false, nil
	}
	if err := s.db.ApplyNoSyncWait(b, s.sync); err != nil {
		return false, false, fmt.Errorf("pebble commit: %w", err)
	}
	return true, true, nil
}

// wake wakes the waiters of the keys t wrote.
func (s *DB) wake(t *tx) {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	if len(s.waiting) == 0 {
		return
	}
	for _, k := range t.written {
		if w, ok := s.waiting[k]; ok {
			close(w.ch)
			delete(s.waiting, k)
		}
	}
	for _, r := range t.cleared {
		for k, w := range s.waiting {
			if k >= r[0] && k < r[1] {
				close(w.ch)
				delete(s.waiting, k)
			}
		}
	}
}

// View runs fn on a snapshot.
func (s *DB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	for {
		err := s.viewOnce(ctx, fn)
		if err == nil || !storage.Retryable(err) {
			return err
		}
	}
}

func (s *DB) viewOnce(ctx context.Context, fn func(storage.ReadTx) error) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	return fn(&tx{r: snap})
}

// WaitChange waits for a commit that leaves key with a value other than seen.
func (s *DB) WaitChange(ctx context.Context, key, seen []byte) error {
	for {
		changed, err := s.waitOnce(ctx, key, seen)
		if changed || err != nil {
			return err
		}
	}
}

// waitOnce reports whether key holds other than seen, and otherwise waits
// for the next commit that writes key.
func (s *DB) waitOnce(ctx context.Context, key, seen []byte) (bool, error) {
	k := string(key)
	w, v, err := s.current(ctx, k)
	if err != nil {
		return false, err
	}
	defer s.unwait(k, w)
	if !storage.SameValue(v, seen) {
		return true, nil
	}
	select {
	case <-w.ch:
		// A commit wrote key. Reported as a change without a re-read (a
		// spurious return if it wrote seen again, which the contract
		// allows), so that a caller whose ctx ends right after that
		// commit's Update returned still learns of it.
		return true, nil
	case <-ctx.Done():
		select {
		case <-w.ch:
			return true, nil // the commit came first
		default:
		}
		return false, ctx.Err()
	case <-s.closed:
		return false, storage.ErrClosed
	}
}

// current registers a waiter on key and then reads its value, in that
// order, so that a commit after the read wakes the waiter.
func (s *DB) current(ctx context.Context, key string) (*keyWait, []byte, error) {
	if err := s.enter(ctx); err != nil {
		return nil, nil, err
	}
	defer s.leave()
	s.notifyMu.Lock()
	w := s.waiting[key]
	if w == nil {
		w = &keyWait{ch: make(chan struct{})}
		s.waiting[key] = w
	}
	w.n++
	s.notifyMu.Unlock()
	v, err := get(s.db, []byte(key))
	if err != nil {
		s.unwait(key, w)
		return nil, nil, err
	}
	return w, v, nil
}

// unwait drops one waiter of key; the last one removes the entry, unless a
// commit already did.
func (s *DB) unwait(key string, w *keyWait) {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	if w.n--; w.n == 0 && s.waiting[key] == w {
		delete(s.waiting, key)
	}
}

// Size reports the bytes of live data: the live WAL's records and the live
// tables. Pebble's DiskSpaceUsage also counts the WAL files it keeps for
// reuse and files awaiting deletion; those do not shrink when data is
// deleted, compacted and defragmented, so a space quota measured by them
// could never be recovered from (etcd's NOSPACE alarm).
func (s *DB) Size() (int64, error) {
	if err := s.enter(context.Background()); err != nil {
		return 0, err
	}
	defer s.leave()
	m := s.db.Metrics()
	return int64(m.WAL.Size + m.Table.Local.LiveSize + m.BlobFiles.Local.LiveSize), nil
}

// RangeSize is Pebble's estimate of the table bytes holding [begin, end);
// data still in the memtable and the WAL is not counted.
func (s *DB) RangeSize(begin, end []byte) (int64, error) {
	if err := s.enter(context.Background()); err != nil {
		return 0, err
	}
	defer s.leave()
	n, err := s.db.EstimateDiskUsage(begin, end)
	if err != nil {
		return 0, fmt.Errorf("pebble estimate disk usage: %w", err)
	}
	return int64(n), nil
}

// Defragment is etcd's defragmentation for Pebble: flush the memtable and
// rewrite every table, dropping deleted and overwritten data, so that Size
// falls to the data that is left.
func (s *DB) Defragment(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("pebble flush: %w", err)
	}
	// Every key of the layout starts with a byte below 0xff (storage keys
	// never use FoundationDB's system prefix).
	if err := s.db.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
		return fmt.Errorf("pebble compact: %w", err)
	}
	return nil
}

// Close flushes nothing extra (every commit is already synced) and closes. It
// waits for transactions in flight; calls that start later fail with ErrClosed,
// and so does a second Close.
func (s *DB) Close() error {
	err := storage.ErrClosed
	s.closeOnce.Do(func() {
		s.lifeMu.Lock()
		s.isClosed = true
		close(s.closed)
		s.lifeMu.Unlock()
		s.inflight.Wait()
		err = s.db.Close()
	})
	return err
}

// enter admits one use of s.db, or fails with ErrClosed or ctx's error. Every
// successful enter is paired with leave. It never blocks, so a transaction
// nested in another one's fn cannot deadlock against Close.
func (s *DB) enter(ctx context.Context) error {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.isClosed {
		return storage.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.inflight.Add(1)
	return nil
}

func (s *DB) leave() { s.inflight.Done() }

type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

type tx struct {
	r reader
	b *pebble.Batch // nil for views

	written []string    // keys Set or Cleared, for wake
	cleared [][2]string // ranges ClearRanged, for wake
}

func get(r reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(v))
	copy(out, v)
	closer.Close()
	return out, nil
}

func (t *tx) Get(key []byte) ([]byte, error) { return get(t.r, key) }

// GetMany reads ascending keys with one iterator, seeking forward, which is
// far cheaper than one Get (one iterator) per key; unsorted input falls back
// to Gets.
func (t *tx) GetMany(keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	if len(keys) < 4 || !ascending(keys) {
		for i, k := range keys {
			v, err := get(t.r, k)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lower(keys[0])})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for i, k := range keys {
		if !seekGE(it, k) || !bytes.Equal(it.Key(), k) {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		out[i] = append(make([]byte, 0, len(v)), v...) // non-nil: present, even if empty
	}
	return out, it.Error()
}

// lower turns the empty key, the smallest one, into nil ("unbounded"): Pebble's
// invariants builds (on under -race) index an empty non-nil bound or seek key.
func lower(begin []byte) []byte {
	if len(begin) == 0 {
		return nil
	}
	return begin
}

func seekGE(it *pebble.Iterator, k []byte) bool {
	if len(k) == 0 {
		return it.First()
	}
	return it.SeekGE(k)
}

func ascending(keys [][]byte) bool {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1], keys[i]) >= 0 {
			return false
		}
	}
	return true
}

// Scan implements storage.Scanner without copying keys or values.
func (t *tx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	if bytes.Compare(begin, end) >= 0 {
		return nil // empty range; a nil end is the empty key, not "no bound"
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lower(begin), UpperBound: end})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !fn(it.Key(), v) {
			break
		}
	}
	return it.Error()
}

func (t *tx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	// begin <= key < end is empty when begin >= end. This also covers end ==
	// nil, which is the empty key, not Pebble's "no upper bound".
	if bytes.Compare(begin, end) >= 0 {
		return nil, nil
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lower(begin), UpperBound: end})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []storage.KeyValue
	valid := it.First
	next := it.Next
	if opt.Reverse {
		valid, next = it.Last, it.Prev
	}
	for ok := valid(); ok; ok = next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		kv := storage.KeyValue{Key: bytes.Clone(it.Key()), Value: make([]byte, len(v))}
		copy(kv.Value, v) // non-nil even when empty, like Get
		out = append(out, kv)
		if opt.Limit > 0 && len(out) >= opt.Limit {
			break
		}
	}
	return out, it.Error()
}

func (t *tx) Set(key, value []byte) {
	_ = t.b.Set(key, value, nil)
	t.written = append(t.written, string(key))
}

func (t *tx) Clear(key []byte) {
	_ = t.b.Delete(key, nil)
	t.written = append(t.written, string(key))
}

func (t *tx) ClearRange(begin, end []byte) {
	if bytes.Compare(begin, end) >= 0 {
		return
	}
	_ = t.b.DeleteRange(begin, end, nil)
	t.cleared = append(t.cleared, [2]string{string(begin), string(end)})
}

// quietLogger drops Pebble's informational chatter; errors still surface as
// returned errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{})  {}
func (quietLogger) Errorf(string, ...interface{}) {}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	panic(fmt.Sprintf(format, args...))
}
