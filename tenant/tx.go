package tenant

import (
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// fence is a transaction's reading of the tenant's live marker. It is read
// with the transaction's first point reads (one GetMany, so it costs no
// round trip of its own on FoundationDB), or on its own before a first
// range read, or at the end of a transaction that read nothing. Reading it
// puts it in the transaction's read set: a delete that commits first makes
// the transaction conflict, and its retry sees the tenant gone.
type fence struct {
	key    []byte
	quotas *quotaCell // takes the quotas the marker carries
	read   bool
	alive  bool
}

func (f *fence) set(v []byte) {
	f.read, f.alive = true, v != nil
	f.quotas.observe(v)
}

func (f *fence) err() error {
	if !f.alive {
		return ErrDeleted
	}
	return nil
}

// wrapped is a transaction on a tenant's keys, with its fence.
type wrapped interface {
	storage.ReadTx
	fenceOf() *fenceTx
}

// fenceTx reads through the fence.
type fenceTx struct {
	r storage.ReadTx
	f fence
	// err is the first write refused for its key's size; like the
	// backends' deferred errors it fails the reads that follow and the
	// commit.
	err error
}

// check reads the fence if no read did yet.
func (t *fenceTx) check() error {
	if t.err != nil {
		return t.err
	}
	if !t.f.read {
		v, err := t.r.Get(t.f.key)
		if err != nil {
			return err
		}
		t.f.set(v)
	}
	return t.f.err()
}

// getMany reads keys (already prefixed), and the fence with them when it
// is still unread.
func (t *fenceTx) getMany(keys [][]byte) ([][]byte, error) {
	vals, _, err := t.readBatch(keys, nil)
	return vals, err
}

// readBatch reads keys and ranges (already prefixed) as one batch
// (storage.ReadBatch), with the fence among the keys when it is still
// unread.
func (t *fenceTx) readBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	if t.err != nil {
		return nil, nil, t.err
	}
	fenced := !t.f.read
	if !fenced {
		if err := t.f.err(); err != nil {
			return nil, nil, err
		}
	} else {
		keys = append(keys[:len(keys):len(keys)], t.f.key)
	}
	vals, rows, err := storage.ReadBatch(t.r, keys, ranges)
	if err != nil {
		return nil, nil, err
	}
	if fenced {
		t.f.set(vals[len(keys)-1])
		vals = vals[:len(keys)-1]
		if err := t.f.err(); err != nil {
			return nil, nil, err
		}
	}
	return vals, rows, nil
}

// readTx is a tenant's view of a transaction of the shared store.
type readTx struct {
	d  *DB
	ft *fenceTx
}

func (t *readTx) fenceOf() *fenceTx { return t.ft }

func (t *readTx) Get(key []byte) ([]byte, error) {
	vals, err := t.ft.getMany([][]byte{t.d.key(key)})
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}

func (t *readTx) GetMany(keys [][]byte) ([][]byte, error) {
	return t.ft.getMany(t.prefixed(keys))
}

// prefixed is keys in the tenant's keyspace.
func (t *readTx) prefixed(keys [][]byte) [][]byte {
	pk := make([][]byte, len(keys))
	for i, k := range keys {
		pk[i] = t.d.key(k)
	}
	return pk
}

// GetRange reads the prefixed range; an empty end stays an empty range,
// since the bare prefix sorts before every prefixed begin.
func (t *readTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if err := t.ft.check(); err != nil {
		return nil, err
	}
	kvs, err := t.ft.r.GetRange(t.d.key(clip(begin)), t.d.key(clip(end)), opt)
	if err != nil {
		return nil, err
	}
	t.unprefix(kvs)
	return kvs, nil
}

// unprefix cuts the tenant's prefix off kvs' keys.
func (t *readTx) unprefix(kvs []storage.KeyValue) {
	n := len(t.d.prefix)
	for i := range kvs {
		kvs[i].Key = kvs[i].Key[n:len(kvs[i].Key):len(kvs[i].Key)]
	}
}

// Snapshot is the backend transaction's (storage.Snapshotter): a tenant's
// Views of one snapshot read the same data as the backend's do, so the
// tenant's store shares what they read of it as a store without tenancy
// does (0, sharing nothing, where the backend names none).
func (t *readTx) Snapshot() int64 { return storage.SnapshotOf(t.ft.r) }

// ReadBatch reads the prefixed keys and ranges through the backend's
// batch, with the fence among the points while it is unread, so that a
// tenant's transaction waits for its first reads as long as a transaction
// without tenancy: on FoundationDB one round trip, where GetMany then each
// GetRange (the fallback without this method) is one each. On a backend
// without a batch it falls back as storage.ReadBatch does.
func (t *readTx) ReadBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	pr := make([]storage.RangeRead, len(ranges))
	for i, r := range ranges {
		pr[i] = storage.RangeRead{Begin: t.d.key(clip(r.Begin)), End: t.d.key(clip(r.End)), Opt: r.Opt}
	}
	vals, rows, err := t.ft.readBatch(t.prefixed(keys), pr)
	if err != nil {
		return nil, nil, err
	}
	for _, kvs := range rows {
		t.unprefix(kvs)
	}
	return vals, rows, nil
}

func (t *readTx) scan(sc storage.Scanner, begin, end []byte, fn func(key, value []byte) bool) error {
	if err := t.ft.check(); err != nil {
		return err
	}
	n := len(t.d.prefix)
	return sc.Scan(t.d.key(clip(begin)), t.d.key(clip(end)), func(k, v []byte) bool { return fn(k[n:], v) })
}

// writeTx adds the writes.
type writeTx struct {
	readTx
	w storage.Tx
}

// Set refuses keys over storage.MaxKeySize as the backends do, although
// the backend would take the prefixed key (storage.MaxNestingBytes).
func (t *writeTx) Set(key, value []byte) {
	if len(key) > storage.MaxKeySize {
		if t.ft.err == nil {
			t.ft.err = fmt.Errorf("%w (set of a %d-byte key)", storage.ErrKeyTooLarge, len(key))
		}
		return
	}
	t.w.Set(t.d.key(key), value)
}

// Clear of a key over storage.MaxKeySize does nothing: no such key exists.
func (t *writeTx) Clear(key []byte) {
	if len(key) <= storage.MaxKeySize {
		t.w.Clear(t.d.key(key))
	}
}

func (t *writeTx) ClearRange(begin, end []byte) {
	t.w.ClearRange(t.d.key(clip(begin)), t.d.key(clip(end)))
}

// clip shortens a range bound to storage.MaxKeySize+1 bytes, which selects
// the same keys (none is longer than storage.MaxKeySize).
func clip(b []byte) []byte {
	if len(b) > storage.MaxKeySize+1 {
		return b[:storage.MaxKeySize+1]
	}
	return b
}

// The Scanner capability is passed on when the backend's transactions have
// it; Go cannot add a method conditionally, hence the two scanning types.
type scanReadTx struct {
	*readTx
	sc storage.Scanner
}

func (t scanReadTx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	return t.scan(t.sc, begin, end, fn)
}

type scanWriteTx struct {
	*writeTx
	sc storage.Scanner
}

func (t scanWriteTx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	return t.scan(t.sc, begin, end, fn)
}

// wrap returns the tenant's view of itx: a storage.Tx when w (itx as a
// Tx) is not nil, with Scan when itx has it.
func (d *DB) wrap(itx storage.ReadTx, w storage.Tx) wrapped {
	rt := readTx{d: d, ft: &fenceTx{r: itx, f: fence{key: d.live, quotas: d.quotas}}}
	sc, canScan := itx.(storage.Scanner)
	if w == nil {
		if canScan {
			return scanReadTx{&rt, sc}
		}
		return &rt
	}
	wt := &writeTx{readTx: rt, w: w}
	if canScan {
		return scanWriteTx{wt, sc}
	}
	return wt
}
