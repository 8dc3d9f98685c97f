// Package storage is the one interface every fdb-etcd backend implements.
//
// It is shaped after FoundationDB rather than after any embedded store, so that
// the layers above it (mvcc, revision, lease) are written once and are correct
// on FoundationDB even when they run on the embedded Pebble backend:
//
//   - Keys are ordered byte strings. Keys are at most MaxKeySize bytes and
//     values at most MaxValueSize bytes; larger values must be chunked by the
//     caller.
//   - Update runs a read-write transaction through a retry loop. The function
//     may run any number of times, including after an attempt that committed
//     but whose outcome was reported as unknown (FoundationDB error 1021), so
//     it must have no side effects outside the transaction and must detect on
//     its own (with a marker written in the same transaction) that an earlier
//     attempt already landed.
//   - A transaction reads its own writes, is serializable with respect to all
//     other transactions, lives at most MaxTransactionAge from its first read
//     and writes at most MaxTransactionBytes.
//   - View runs a read-only transaction on a consistent snapshot. It is subject
//     to the same age limit, so long scans must be paged across several Views.
//     By default the snapshot is at least as new as every commit that
//     completed before View was called; a View whose context says Recent
//     (WithFreshness) may read a snapshot a few milliseconds older.
//   - WaitChange blocks until a key's value differs from a value the caller has
//     seen; it is how a reader learns about new commits without polling
//     (FoundationDB watches map directly onto it).
package storage

import (
	"bytes"
	"context"
	"errors"
	"time"
)

// FoundationDB's documented limits. Every backend enforces or at least
// tolerates them; the faulty wrapper enforces them exactly.
const (
	MaxKeySize          = 10_000
	MaxValueSize        = 100_000
	MaxTransactionBytes = 10_000_000
	MaxTransactionAge   = 5 * time.Second
	// MaxNestingBytes is the room backends leave above MaxKeySize so that
	// one keyspace can nest in another (package tenant prefixes every key
	// of a tenant) while the nested keyspace's callers keep MaxKeySize
	// bytes of their own; the nesting layer enforces MaxKeySize on them.
	MaxNestingBytes = 16
)

// KeyValue is one stored pair.
type KeyValue struct {
	Key   []byte
	Value []byte
}

// RangeOptions bound a range read. A zero Limit means no limit.
type RangeOptions struct {
	Limit   int
	Reverse bool
}

// ReadTx reads from a consistent snapshot (View) or from a read-write
// transaction, which also sees its own writes (Update). Returned slices are
// owned by the caller. A nil value means absent; an empty non-nil value is a
// present, empty value. A nil or empty range end is an empty range, never
// "to the end": pass Strinc(prefix) or an explicit bound. Keys starting with
// 0xff are FoundationDB's system keyspace and must not be used.
type ReadTx interface {
	// Get returns the value at key, or nil when the key is absent.
	Get(key []byte) ([]byte, error)
	// GetMany returns the values at keys, in order, nil for absent keys. Backends
	// issue the reads concurrently where they can.
	GetMany(keys [][]byte) ([][]byte, error)
	// GetRange returns the pairs with begin <= key < end in key order (or in
	// reverse order when opt.Reverse), at most opt.Limit of them.
	GetRange(begin, end []byte, opt RangeOptions) ([]KeyValue, error)
}

// Tx is a read-write transaction. Set copies its arguments.
type Tx interface {
	ReadTx
	Set(key, value []byte)
	Clear(key []byte)
	// ClearRange removes every key with begin <= key < end.
	ClearRange(begin, end []byte)
}

// DB is a backend.
type DB interface {
	// Update runs fn in a read-write transaction and commits it, retrying on
	// retryable errors (conflicts, transactions too old, commit unknown result)
	// until it commits, fn returns a non-retryable error, or ctx ends.
	Update(ctx context.Context, fn func(tx Tx) error) error
	// View runs fn on a consistent read-only snapshot, retrying like Update.
	View(ctx context.Context, fn func(tx ReadTx) error) error
	// WaitChange returns once the value at key differs from seen (nil meaning
	// absent), or with ctx's error. It may return spuriously; callers re-read.
	// A commit through this DB wakes its WaitChange calls on the keys it
	// wrote before its Update returns: such a call returns nil even if its
	// ctx ends right after. Commits through other handles wake it later.
	// The number of concurrent calls is not limited: a backend whose
	// notifications run out (FoundationDB's watches) polls instead.
	WaitChange(ctx context.Context, key, seen []byte) error
	// Close waits for calls in flight, wakes blocked WaitChange calls, and
	// releases the backend. Calls after Close, and a second Close, fail with
	// ErrClosed.
	Close() error
}

// SameValue reports whether v is seen as WaitChange compares them: both
// absent (nil), or both present with the same bytes. An empty value is
// present: a key written empty has changed from absent.
func SameValue(v, seen []byte) bool {
	return (v == nil) == (seen == nil) && bytes.Equal(v, seen)
}

// Scanner is an optional ReadTx capability: visit a range in key order
// without copying. key and value are only valid during the call; fn returns
// false to stop. Readers fall back to GetRange when a backend lacks it.
type Scanner interface {
	Scan(begin, end []byte, fn func(key, value []byte) bool) error
}

// Scan visits up to limit key-value pairs of [begin, end) in key order (0:
// no limit) until fn returns false: through tx's Scanner when it has one,
// else over one GetRange. It is the one fallback, so every reader gets the
// zero-copy path where the backend offers it and the same visits where not.
func Scan(tx ReadTx, begin, end []byte, limit int, fn func(key, value []byte) bool) error {
	if sc, ok := tx.(Scanner); ok {
		n := 0
		return sc.Scan(begin, end, func(k, v []byte) bool {
			n++
			return fn(k, v) && (limit <= 0 || n < limit)
		})
	}
	kvs, err := tx.GetRange(begin, end, RangeOptions{Limit: limit})
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		if !fn(kv.Key, kv.Value) {
			break
		}
	}
	return nil
}

// Freshness is how new a View's snapshot must be. It travels in the
// context (WithFreshness) rather than as a View parameter, so that every
// wrapper of a DB passes it on untouched.
type Freshness uint8

const (
	// Latest: a snapshot at least as new as every commit that completed
	// before View was called, as a linearizable read needs. The default.
	Latest Freshness = iota
	// Recent: a snapshot that was Latest at most a backend-defined bound
	// (a few milliseconds) before View was called, and never older than a
	// snapshot this DB has already read or a commit it has made, so that
	// a process's Recent reads do not go back in time and see its own
	// writes. What a serializable read may use; a backend without a
	// cheaper snapshot reads the latest. An Update whose context says
	// Recent may read such a snapshot too (its writes are still checked
	// for conflicts up to its commit, and so are the reads of one that
	// writes nothing), so its function must decide only through what it
	// writes and what it returns on success: an error it returns may rest
	// on the older snapshot.
	Recent
)

type freshnessKey struct{}

// WithFreshness returns ctx with f for the View calls it is passed to.
func WithFreshness(ctx context.Context, f Freshness) context.Context {
	return context.WithValue(ctx, freshnessKey{}, f)
}

// FreshnessOf is the Freshness ctx asks for, Latest unless WithFreshness
// said otherwise.
func FreshnessOf(ctx context.Context) Freshness {
	f, _ := ctx.Value(freshnessKey{}).(Freshness)
	return f
}

// RangeRead is one range read of a ReadBatch.
type RangeRead struct {
	Begin, End []byte
	Opt        RangeOptions
}

// Batcher is an optional ReadTx capability: issue point and range reads
// together and wait for all of them — one round trip on FoundationDB,
// where GetMany then GetRange are two. Results are as GetMany's and each
// GetRange's.
type Batcher interface {
	ReadBatch(keys [][]byte, ranges []RangeRead) ([][]byte, [][]KeyValue, error)
}

// ReadBatch reads keys and ranges through tx's Batcher when it has one,
// else with GetMany and one GetRange per range: the one fallback, as Scan's.
func ReadBatch(tx ReadTx, keys [][]byte, ranges []RangeRead) ([][]byte, [][]KeyValue, error) {
	if b, ok := tx.(Batcher); ok {
		return b.ReadBatch(keys, ranges)
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return nil, nil, err
	}
	out := make([][]KeyValue, len(ranges))
	for i, r := range ranges {
		if out[i], err = tx.GetRange(r.Begin, r.End, r.Opt); err != nil {
			return nil, nil, err
		}
	}
	return vals, out, nil
}

// Snapshotter is an optional capability of a View's ReadTx: the snapshot
// it reads, named so that the layer above can share what it reads of one
// snapshot among the Views that read the same one (on FoundationDB,
// concurrent Views share read versions). Two Views of one DB whose
// Snapshot is the same non-zero value read the same data; a View that
// starts after a commit through the DB returned, and does not say Recent,
// has a greater Snapshot than any View that started before that commit.
// An Update's transaction never has one: its reads must be its own, since
// they are what its commit is checked against.
type Snapshotter interface {
	Snapshot() int64
}

// SnapshotOf is tx's Snapshot, 0 when it has none.
func SnapshotOf(tx ReadTx) int64 {
	if s, ok := tx.(Snapshotter); ok {
		return s.Snapshot()
	}
	return 0
}

// Sizer is an optional capability: the approximate bytes the store uses on
// disk, reported as etcd's db size.
type Sizer interface {
	Size() (int64, error)
}

// RangeSizer is an optional capability: an estimate of the bytes the keys
// in [begin, end) use, sampled like FoundationDB's estimated range size. It
// may report 0 for a small range (data not yet sampled or flushed); callers
// that need a floor count small ranges themselves.
type RangeSizer interface {
	RangeSize(begin, end []byte) (int64, error)
}

// Errors with FoundationDB's meaning. Backends return these (wrapped) so that
// the layers above can match them with errors.Is.
var (
	ErrClosed              = errors.New("storage: closed")
	ErrNotCommitted        = errors.New("storage: transaction not committed due to conflict (1020)")
	ErrTransactionTooOld   = errors.New("storage: transaction is too old to perform reads or be committed (1007)")
	ErrCommitUnknownResult = errors.New("storage: transaction may or may not have committed (1021)")
	ErrKeyTooLarge         = errors.New("storage: key length exceeds limit (2102)")
	ErrValueTooLarge       = errors.New("storage: value length exceeds limit (2103)")
	ErrTransactionTooLarge = errors.New("storage: transaction exceeds byte limit (2101)")
)

// Retryable reports whether an error means "run the transaction again": the
// attempt either did not commit, or (commit unknown result) may have.
func Retryable(err error) bool {
	return errors.Is(err, ErrNotCommitted) ||
		errors.Is(err, ErrTransactionTooOld) ||
		errors.Is(err, ErrCommitUnknownResult)
}

// Strinc returns the first key that is not prefixed by prefix, the end of a
// prefix range. It panics on a prefix of only 0xff bytes, which has no end.
func Strinc(prefix []byte) []byte {
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] != 0xff {
			end := make([]byte, i+1)
			copy(end, prefix[:i+1])
			end[i]++
			return end
		}
	}
	panic("storage: Strinc of an all-0xff prefix")
}
