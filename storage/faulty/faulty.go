// Package faulty wraps a storage.DB so that it behaves like FoundationDB at its
// least convenient: it enforces FoundationDB's key, value, transaction-size and
// transaction-age limits exactly, and it injects the failures a FoundationDB
// client sees — conflicts that force a retry, transactions that grow too old,
// and commits that land but are reported as "commit unknown result" (1021).
// The layers above must stay correct under all of it.
package faulty

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Options choose which faults to inject. Probabilities are in [0, 1].
type Options struct {
	Seed int64
	// RetryProbability aborts an attempt with a conflict after fn ran.
	RetryProbability float64
	// CommitUnknownProbability commits an attempt, then reports 1021 so that fn
	// runs again on top of its own committed writes. At most
	// MaxUnknownsPerUpdate are injected into one Update call, so that 1 means
	// "every Update is repeated that many times" rather than "never returns".
	CommitUnknownProbability float64
	// TooOldProbability fails a read with transaction_too_old (1007).
	TooOldProbability float64
	// Now is the clock used for the 5 s transaction age; nil means time.Now.
	Now func() time.Time
}

// MaxUnknownsPerUpdate caps the commit-unknown results injected into one
// Update call.
const MaxUnknownsPerUpdate = 3

// Stats count what was injected and enforced.
type Stats struct {
	Retries, Unknowns, TooOld, LimitErrors atomic.Int64
}

// DB is the wrapper.
type DB struct {
	inner storage.DB
	opt   Options
	Stats Stats

	mu  sync.Mutex
	rnd *rand.Rand
}

var (
	_ storage.DB      = (*DB)(nil)
	_ storage.Scanner = (*tx)(nil)
)

// Wrap returns inner wrapped with the given faults.
func Wrap(inner storage.DB, opt Options) *DB {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &DB{inner: inner, opt: opt, rnd: rand.New(rand.NewSource(opt.Seed))}
}

// SetOptions changes the fault rates while the wrapper is in use.
func (d *DB) SetOptions(opt Options) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if opt.Now == nil {
		opt.Now = time.Now
	}
	d.opt = opt
}

func (d *DB) roll(p func(Options) float64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := p(d.opt)
	return q > 0 && d.rnd.Float64() < q
}

func (d *DB) now() time.Time {
	d.mu.Lock()
	now := d.opt.Now
	d.mu.Unlock()
	return now()
}

// Update enforces limits and injects faults around inner's transaction.
func (d *DB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	for unknowns := 0; ; {
		if err := ctx.Err(); err != nil {
			return err
		}
		unknown := unknowns < MaxUnknownsPerUpdate &&
			d.roll(func(o Options) float64 { return o.CommitUnknownProbability })
		err := d.inner.Update(ctx, func(itx storage.Tx) error {
			t := &tx{d: d, r: itx, w: itx}
			if err := fn(t); err != nil {
				return err
			}
			if err := t.commitCheck(); err != nil {
				return err
			}
			if d.roll(func(o Options) float64 { return o.RetryProbability }) {
				d.Stats.Retries.Add(1)
				return storage.ErrNotCommitted
			}
			return nil
		})
		if err == nil && unknown {
			unknowns++
			d.Stats.Unknowns.Add(1)
			continue // it committed; the caller's marker must notice
		}
		if err != nil && storage.Retryable(err) && ctx.Err() == nil {
			continue // inner gave up on a retryable error; FDB's loop would not
		}
		return err
	}
}

// View enforces the read limits.
func (d *DB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return d.inner.View(ctx, func(itx storage.ReadTx) error {
		t := &tx{d: d, r: itx}
		if err := fn(t); err != nil {
			return err
		}
		return t.commitCheck()
	})
}

// WaitChange passes through.
func (d *DB) WaitChange(ctx context.Context, key, seen []byte) error {
	return d.inner.WaitChange(ctx, key, seen)
}

// Close closes inner.
func (d *DB) Close() error { return d.inner.Close() }

// Size passes through when inner can report it.
func (d *DB) Size() (int64, error) {
	if s, ok := d.inner.(storage.Sizer); ok {
		return s.Size()
	}
	return 0, nil
}

type tx struct {
	d       *DB
	r       storage.ReadTx
	w       storage.Tx
	started bool
	start   time.Time
	bytes   int
	err     error // first limit error; sticky, like FDB's deferred error
	tooOld  bool  // a read failed with 1007; so will the commit
}

// commitCheck is what FoundationDB would report at commit: the first limit
// error, or 1007 when a read already failed with it or the transaction's first
// read is more than MaxTransactionAge ago. Write-only transactions take their
// read version at commit and are never too old.
func (t *tx) commitCheck() error {
	if t.err != nil {
		t.d.Stats.LimitErrors.Add(1)
		return t.err
	}
	if t.tooOld || t.started && t.d.now().Sub(t.start) > storage.MaxTransactionAge {
		t.d.Stats.TooOld.Add(1)
		return storage.ErrTransactionTooOld
	}
	return nil
}

// read starts the age clock at the first read and fails reads the way FDB
// does. Keys longer than MaxKeySize are not an error for reads: FDB answers
// "absent" for them and truncates range bounds, which is equivalent because
// no such key can be stored.
func (t *tx) read() error {
	if t.err != nil {
		return t.err
	}
	if !t.started {
		t.started, t.start = true, t.d.now()
	}
	if t.d.roll(func(o Options) float64 { return o.TooOldProbability }) {
		t.d.Stats.TooOld.Add(1)
		t.tooOld = true
		return storage.ErrTransactionTooOld
	}
	if t.d.now().Sub(t.start) > storage.MaxTransactionAge {
		t.d.Stats.TooOld.Add(1)
		t.tooOld = true
		return storage.ErrTransactionTooOld
	}
	return nil
}

func (t *tx) Get(key []byte) ([]byte, error) {
	if err := t.read(); err != nil {
		return nil, err
	}
	return t.r.Get(key)
}

func (t *tx) GetMany(keys [][]byte) ([][]byte, error) {
	if err := t.read(); err != nil {
		return nil, err
	}
	return t.r.GetMany(keys)
}

func (t *tx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if err := t.read(); err != nil {
		return nil, err
	}
	return t.r.GetRange(begin, end, opt)
}

// Scan passes storage.Scanner through with the same checks as any read, so
// that callers take their fast path under faults too; over an inner backend
// without it, it replays GetRange.
func (t *tx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	if err := t.read(); err != nil {
		return err
	}
	return storage.Scan(t.r, begin, end, 0, fn)
}

func (t *tx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

func (t *tx) account(n int) {
	t.bytes += n
	if t.bytes > storage.MaxTransactionBytes {
		t.fail(fmt.Errorf("%d bytes written: %w", t.bytes, storage.ErrTransactionTooLarge))
	}
}

// Set fails the transaction (at commit, like FDB's deferred error) on an
// oversized key or value, and then does not pass the write on, so that no
// read can see a key FoundationDB could never hold.
func (t *tx) Set(key, value []byte) {
	switch {
	case len(key) > storage.MaxKeySize:
		t.fail(fmt.Errorf("set of %d-byte key: %w", len(key), storage.ErrKeyTooLarge))
		return
	case len(value) > storage.MaxValueSize:
		t.fail(fmt.Errorf("set of %d-byte value: %w", len(value), storage.ErrValueTooLarge))
		return
	}
	t.account(len(key) + len(value))
	t.w.Set(key, value)
}

// Clear of a key longer than MaxKeySize is a no-op in FDB: no such key exists.
func (t *tx) Clear(key []byte) {
	if len(key) > storage.MaxKeySize {
		return
	}
	t.account(len(key))
	t.w.Clear(key)
}

// ClearRange bounds longer than MaxKeySize are truncated by FDB to an
// equivalent bound; only the truncated size counts.
func (t *tx) ClearRange(begin, end []byte) {
	t.account(min(len(begin), storage.MaxKeySize+1) + min(len(end), storage.MaxKeySize+1))
	t.w.ClearRange(begin, end)
}
