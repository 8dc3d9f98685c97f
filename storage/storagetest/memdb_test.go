package storagetest

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// memDB is a deliberately simple reference backend: a map replaced wholesale
// on every commit (so a View holds an immutable snapshot) and an Update lock.
// The mutant flags each break one piece of the contract, to show that the
// suite notices.
type memDB struct {
	m       mutant
	commits int // successful updateOnce calls, for loseCommits

	writeMu sync.Mutex // serialises Update

	mu       sync.Mutex
	state    map[string][]byte // published; never modified
	previous map[string][]byte // the state before the last commit (recentStale)
	version  int64             // commits published so far: the name of state's snapshot
	notify   chan struct{}
	isClosed bool
	closed   chan struct{}
}

type mutant struct {
	name string

	noReverse       bool // GetRange ignores Reverse
	noLimit         bool // GetRange ignores Limit
	reverseLimitBug bool // reverse+limit takes the first keys, then reverses
	nilEndUnbounded bool // GetRange and ClearRange treat a nil end as +inf
	signedOrder     bool // keys compare as signed bytes
	emptyIsAbsent   bool // Get returns nil for an empty value
	getManySorted   bool // GetMany answers in key order, not request order
	batchLastRange  bool // ReadBatch answers every range with the last one's pairs
	getManyNoRYW    bool // GetMany reads committed state inside Update
	aliasValues     bool // Set keeps, and Get returns, the caller's slices
	truncValues     bool // values are cut to 64 KiB
	truncKeys       bool // keys are cut to 4 KiB
	liveView        bool // View reads the latest commit at each read
	noSerialize     bool // Updates run unlocked on a start snapshot; last commit wins
	noRollback      bool // a failing fn's writes are committed anyway
	noRYW           bool // reads inside Update ignore the transaction's writes
	noClearRangeRYW bool // reads inside Update ignore the transaction's ClearRange
	clearRangeIncl  bool // ClearRange also removes end
	noRetry         bool // Update returns a retryable error from fn
	noViewRetry     bool // View returns a retryable error from fn
	retryForever    bool // Update ignores ctx while retrying
	noCtxCheck      bool // a canceled ctx does not stop Update and View
	waitNoBlock     bool // WaitChange returns at once
	waitNilIsEmpty  bool // WaitChange treats an empty value as absent
	waitIgnoresCtx  bool // WaitChange waits for a change only
	waitNoWake      bool // commits do not wake WaitChange
	wakeLate        bool // commits wake WaitChange after Update returned
	noClosed        bool // Close does not stop later calls
	closeNoWake     bool // Close does not wake WaitChange
	bigTxFails      bool // a transaction over 1 MB fails
	absentIsEmpty   bool // Get returns an empty value for an absent key
	clearNoop       bool // Clear does nothing
	loseCommits     bool // every 5th successful Update is not committed
	panicAfterClose bool // calls after Close panic (like Pebble itself)
	scanNoStop      bool // Scan ignores fn returning false
	scanNilEnd      bool // Scan treats a nil end as +inf
	recentStale     bool // a Recent View reads the state before the last commit
	snapshotFixed   bool // every View names the same snapshot

	// Allowed behaviours the suite must accept.
	repeatCommits bool // fn runs again after its commit (commit unknown result)
	spuriousWake  bool // WaitChange returns on any commit without re-checking
}

// wakeLateBy is how long after its commit a wakeLate mutant wakes.
const wakeLateBy = 50 * time.Millisecond

func newMemDB(m mutant) *memDB {
	return &memDB{m: m, state: map[string][]byte{}, notify: make(chan struct{}), closed: make(chan struct{})}
}

var _ storage.DB = (*memDB)(nil)

func (d *memDB) check(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed && d.m.panicAfterClose {
		panic("memdb: used after Close")
	}
	if d.isClosed && !d.m.noClosed {
		return storage.ErrClosed
	}
	if d.m.noCtxCheck {
		return nil
	}
	return ctx.Err()
}

func (d *memDB) snapshot() map[string][]byte {
	state, _ := d.namedSnapshot()
	return state
}

// namedSnapshot is the published state and its name (storage.Snapshotter):
// its version, 1 before the first commit.
func (d *memDB) namedSnapshot() (map[string][]byte, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state, d.version + 1
}

func (d *memDB) stale() map[string][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.previous == nil {
		return d.state
	}
	return d.previous
}

func (d *memDB) publish(next map[string][]byte) {
	d.mu.Lock()
	d.previous, d.state = d.state, next
	d.version++
	switch {
	case d.m.wakeLate:
		ch := d.notify
		time.AfterFunc(wakeLateBy, func() { close(ch) })
		d.notify = make(chan struct{})
	case !d.m.waitNoWake:
		close(d.notify)
		d.notify = make(chan struct{})
	}
	d.mu.Unlock()
}

func (d *memDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	repeated := false
	for {
		if err := d.check(ctx); err != nil && !(d.m.retryForever && !errorsIsClosed(err)) {
			return err
		}
		err := d.updateOnce(fn)
		if err == nil && d.m.repeatCommits && !repeated {
			repeated = true
			continue
		}
		if err == nil || !storage.Retryable(err) || d.m.noRetry {
			return err
		}
	}
}

func errorsIsClosed(err error) bool { return errors.Is(err, storage.ErrClosed) }

func (d *memDB) updateOnce(fn func(storage.Tx) error) error {
	if !d.m.noSerialize {
		d.writeMu.Lock()
		defer d.writeMu.Unlock()
	}
	base := d.snapshot()
	t := &memTx{d: d, base: base, work: maps.Clone(base), noClear: maps.Clone(base)}
	err := fn(t)
	if err != nil && !(d.m.noRollback && !storage.Retryable(err)) {
		return err
	}
	if d.m.bigTxFails && t.bytes > 1<<20 {
		return storage.ErrTransactionTooLarge
	}
	if err == nil && d.m.loseCommits {
		d.mu.Lock()
		d.commits++
		lose := d.commits%5 == 0
		d.mu.Unlock()
		if lose {
			return nil
		}
	}
	next := t.work
	if d.m.noSerialize {
		next = maps.Clone(d.snapshot())
		for _, op := range t.ops {
			op(next)
		}
	}
	d.publish(next)
	return err
}

func (d *memDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	for {
		if err := d.check(ctx); err != nil {
			return err
		}
		t := &memTx{d: d, view: true}
		t.base, t.snap = d.namedSnapshot()
		if d.m.recentStale && storage.FreshnessOf(ctx) == storage.Recent {
			t.base = d.stale()
		}
		if d.m.snapshotFixed {
			t.snap = 1
		}
		t.work = t.base
		err := fn(t)
		if err == nil || !storage.Retryable(err) || d.m.noViewRetry {
			return err
		}
	}
}

func (d *memDB) WaitChange(ctx context.Context, key, seen []byte) error {
	for {
		if err := d.check(context.Background()); err != nil {
			return err
		}
		if d.m.waitNoBlock {
			return nil
		}
		d.mu.Lock()
		ch := d.notify
		v, ok := d.state[string(key)]
		d.mu.Unlock()
		if d.m.waitNilIsEmpty {
			if !bytes.Equal(v, seen) {
				return nil
			}
		} else if ok != (seen != nil) || !bytes.Equal(v, seen) {
			return nil
		}
		done := ctx.Done()
		if d.m.waitIgnoresCtx {
			done = nil
		}
		closed := d.closed
		if d.m.closeNoWake {
			closed = nil
		}
		select {
		case <-ch:
			if d.m.spuriousWake {
				return nil
			}
		case <-done:
			select {
			case <-ch:
				continue // a commit that completed first wins
			default:
			}
			return ctx.Err()
		case <-closed:
			return storage.ErrClosed
		}
	}
}

func (d *memDB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isClosed {
		return storage.ErrClosed
	}
	d.isClosed = true
	close(d.closed)
	return nil
}

type memTx struct {
	d       *memDB
	base    map[string][]byte // state when the transaction began
	work    map[string][]byte // base plus the transaction's writes
	noClear map[string][]byte // work without ClearRanges (noClearRangeRYW)
	ops     []func(map[string][]byte)
	view    bool
	snap    int64 // a View's snapshot name
	bytes   int
}

func (t *memTx) Snapshot() int64 { return t.snap }

func (t *memTx) compare(a, b []byte) int {
	if !t.d.m.signedOrder {
		return bytes.Compare(a, b)
	}
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return int(int8(a[i])) - int(int8(b[i]))
		}
	}
	return len(a) - len(b)
}

// source is the map reads go to.
func (t *memTx) source() map[string][]byte {
	switch {
	case t.view && t.d.m.liveView:
		return t.d.snapshot()
	case !t.view && t.d.m.noRYW:
		return t.base
	case !t.view && t.d.m.noClearRangeRYW:
		return t.noClear
	}
	return t.work
}

func (t *memTx) out(v []byte, ok bool) []byte {
	if !ok && t.d.m.absentIsEmpty {
		return []byte{}
	}
	if !ok || t.d.m.emptyIsAbsent && len(v) == 0 {
		return nil
	}
	if t.d.m.aliasValues {
		return v
	}
	return append([]byte{}, v...)
}

func (t *memTx) Get(key []byte) ([]byte, error) {
	v, ok := t.source()[string(key)]
	return t.out(v, ok), nil
}

func (t *memTx) GetMany(keys [][]byte) ([][]byte, error) {
	src := t.source()
	if t.d.m.getManyNoRYW && !t.view {
		src = t.base
	}
	order := keys
	if t.d.m.getManySorted {
		order = slices.Clone(keys)
		slices.SortFunc(order, bytes.Compare)
	}
	out := make([][]byte, len(keys))
	for i, k := range order {
		v, ok := src[string(k)]
		out[i] = t.out(v, ok)
	}
	return out, nil
}

// ReadBatch makes the reference a storage.Batcher, so that the suite
// checks a backend's own batch as well as the fallback.
func (t *memTx) ReadBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	vals, err := t.GetMany(keys)
	if err != nil {
		return nil, nil, err
	}
	out := make([][]storage.KeyValue, len(ranges))
	for i, r := range ranges {
		if t.d.m.batchLastRange {
			r = ranges[len(ranges)-1]
		}
		if out[i], err = t.GetRange(r.Begin, r.End, r.Opt); err != nil {
			return nil, nil, err
		}
	}
	return vals, out, nil
}

func (t *memTx) inRange(k, begin, end []byte) bool {
	if t.compare(k, begin) < 0 {
		return false
	}
	return end == nil && t.d.m.nilEndUnbounded || t.compare(k, end) < 0
}

func (t *memTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	src := t.source()
	var keys [][]byte
	for k := range src {
		if t.inRange([]byte(k), begin, end) {
			keys = append(keys, []byte(k))
		}
	}
	slices.SortFunc(keys, t.compare)
	rev := opt.Reverse && !t.d.m.noReverse
	limit := opt.Limit
	if t.d.m.noLimit {
		limit = 0
	}
	if rev && !t.d.m.reverseLimitBug {
		slices.Reverse(keys)
	}
	if limit > 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	if rev && t.d.m.reverseLimitBug {
		slices.Reverse(keys)
	}
	out := make([]storage.KeyValue, len(keys))
	for i, k := range keys {
		out[i] = storage.KeyValue{Key: k, Value: t.out(src[string(k)], true)}
		if out[i].Value == nil {
			out[i].Value = []byte{}
		}
	}
	return out, nil
}

// Scan makes memTx a storage.Scanner.
func (t *memTx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	if end == nil && t.d.m.scanNilEnd {
		end = []byte{0xff, 0xff}
	}
	kvs, err := t.GetRange(begin, end, storage.RangeOptions{})
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		if !fn(kv.Key, kv.Value) && !t.d.m.scanNoStop {
			break
		}
	}
	return nil
}

func (t *memTx) apply(op func(map[string][]byte), clearRange bool) {
	op(t.work)
	if !clearRange {
		op(t.noClear)
	}
	t.ops = append(t.ops, op)
}

func (t *memTx) Set(key, value []byte) {
	t.bytes += len(key) + len(value)
	if t.d.m.truncValues && len(value) > 64<<10 {
		value = value[:64<<10]
	}
	if t.d.m.truncKeys && len(key) > 4<<10 {
		key = key[:4<<10]
	}
	if !t.d.m.aliasValues {
		value = append([]byte{}, value...)
	} else if value == nil {
		value = []byte{}
	}
	k := string(key)
	t.apply(func(m map[string][]byte) { m[k] = value }, false)
}

func (t *memTx) Clear(key []byte) {
	if t.d.m.clearNoop {
		return
	}
	k := string(key)
	t.apply(func(m map[string][]byte) { delete(m, k) }, false)
}

func (t *memTx) ClearRange(begin, end []byte) {
	begin, end = bytes.Clone(begin), bytes.Clone(end)
	if end == nil && !t.d.m.nilEndUnbounded {
		end = []byte{}
	}
	t.apply(func(m map[string][]byte) {
		for k := range m {
			if t.inRange([]byte(k), begin, end) || t.d.m.clearRangeIncl && k == string(end) {
				delete(m, k)
			}
		}
	}, true)
}
