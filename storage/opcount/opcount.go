// Package opcount wraps a storage.DB and counts the FoundationDB work each
// transaction attempt costs: read versions, sequential read round trips,
// commits, and keys and bytes read and written. Tests use it to pin the
// number of round trips an etcd request takes, so that it cannot grow
// without a golden file changing; it is never part of the server.
//
// The model is FoundationDB's client: an attempt takes one read version
// (on its first read, or at commit for a blind write); every Get or
// GetRange waits for the previous call, so each is one round trip; GetMany's
// reads are issued together, one round trip; an attempt that wrote commits
// in one more round trip, and a read-only one commits locally. A read of a
// key the attempt has already read or written is answered by the
// transaction's read-your-writes cache and costs no round trip (point reads
// only: a key found absent by a range read is counted again). Its Views do
// not name their snapshot (storage.Snapshotter), so the counts are what a
// request costs alone: reads that concurrent requests of one snapshot
// share are counted in full.
package opcount

import (
	"context"
	"fmt"
	"sync"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Counts is the work of the attempts since the last Reset.
type Counts struct {
	Attempts     int // transaction functions run (Update and View, retries included)
	ReadVersions int // attempts that read or wrote
	ReadRounds   int // sequential read round trips
	// Reads are the read requests sent: each key a Get or GetMany reads
	// from the cluster, each GetRange and Scan. Each is a message the
	// client's network thread and a storage server handle, so they bound
	// throughput where round trips bound latency.
	Reads        int
	Commits      int // attempts that wrote
	KeysRead     int
	BytesRead    int
	KeysWritten  int // Sets, Clears and ClearRanges
	BytesWritten int
}

// RoundTrips is what a client waits for in sequence: the read version, the
// reads one after another, and the commit, summed over attempts.
func (c Counts) RoundTrips() int { return c.ReadVersions + c.ReadRounds + c.Commits }

func (c Counts) String() string {
	return fmt.Sprintf("round_trips=%d attempts=%d read_versions=%d read_rounds=%d reads=%d commits=%d keys_read=%d bytes_read=%d keys_written=%d bytes_written=%d",
		c.RoundTrips(), c.Attempts, c.ReadVersions, c.ReadRounds, c.Reads, c.Commits, c.KeysRead, c.BytesRead, c.KeysWritten, c.BytesWritten)
}

func (c *Counts) add(o Counts) {
	c.Attempts += o.Attempts
	c.ReadVersions += o.ReadVersions
	c.ReadRounds += o.ReadRounds
	c.Reads += o.Reads
	c.Commits += o.Commits
	c.KeysRead += o.KeysRead
	c.BytesRead += o.BytesRead
	c.KeysWritten += o.KeysWritten
	c.BytesWritten += o.BytesWritten
}

// DB counts the work done through it. WaitChange (not a transaction) and
// Close go to the wrapped DB; storage.Sizer passes through.
type DB struct {
	storage.DB

	mu    sync.Mutex
	total Counts // guarded by mu
}

// Wrap counts the transactions run through the returned DB on inner.
func Wrap(inner storage.DB) *DB { return &DB{DB: inner} }

// Reset returns the counts so far and starts again from zero.
func (d *DB) Reset() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.total
	d.total = Counts{}
	return c
}

func (d *DB) record(c Counts) {
	d.mu.Lock()
	d.total.add(c)
	d.mu.Unlock()
}

// Update counts every attempt of fn, the failed ones too: each cost its
// round trips. It counts them at a fresh read version: a backend's reuse of
// a recent one for a storage.Recent Update (and the commit that checks the
// reads of one that then wrote nothing) depends on timing, so the Update
// it passes on asks for the latest.
func (d *DB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	ctx = storage.WithFreshness(ctx, storage.Latest)
	return d.DB.Update(ctx, func(inner storage.Tx) error {
		t := &tx{r: inner, w: inner}
		err := fn(t.wrap())
		t.c.Attempts = 1
		if t.c.KeysWritten > 0 {
			t.c.Commits = 1
		}
		if t.c.ReadRounds > 0 || t.c.Commits > 0 {
			t.c.ReadVersions = 1
		}
		d.record(t.c)
		return err
	})
}

// View counts every attempt of fn.
func (d *DB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return d.DB.View(ctx, func(inner storage.ReadTx) error {
		t := &tx{r: inner}
		err := fn(t.wrap())
		t.c.Attempts = 1
		if t.c.ReadRounds > 0 {
			t.c.ReadVersions = 1
		}
		d.record(t.c)
		return err
	})
}

// Size passes the wrapped DB's size through, or reports none.
func (d *DB) Size() (int64, error) {
	if s, ok := d.DB.(storage.Sizer); ok {
		return s.Size()
	}
	return 0, nil
}

// tx counts one attempt. Only its own goroutine uses it, as storage.Tx
// requires.
type tx struct {
	r     storage.ReadTx
	w     storage.Tx // nil in a View
	c     Counts
	known map[string]bool    // keys read or written: the read cache
	clear []storage.KeyValue // ranges cleared, as begin and end
}

// cached reports whether a read of key is answered locally.
func (t *tx) cached(key []byte) bool {
	if t.known[string(key)] {
		return true
	}
	for _, r := range t.clear {
		if string(key) >= string(r.Key) && string(key) < string(r.Value) {
			return true
		}
	}
	return false
}

func (t *tx) learn(key []byte) {
	if t.known == nil {
		t.known = map[string]bool{}
	}
	t.known[string(key)] = true
}

// wrap is what the transaction function gets: t, without Scan even when
// the inner transaction has it, since FoundationDB's have none: readers
// take the paths they take on FoundationDB, and so does the count.
func (t *tx) wrap() storage.Tx { return t }

func (t *tx) Get(key []byte) ([]byte, error) {
	if t.cached(key) {
		return t.r.Get(key)
	}
	v, err := t.r.Get(key)
	t.c.ReadRounds++
	t.c.Reads++
	t.learn(key)
	if v != nil {
		t.c.KeysRead++
		t.c.BytesRead += len(key) + len(v)
	}
	return v, err
}

func (t *tx) GetMany(keys [][]byte) ([][]byte, error) {
	vs, err := t.r.GetMany(keys)
	remote := false
	for _, k := range keys {
		if !t.cached(k) {
			remote = true
		}
	}
	if remote {
		t.c.ReadRounds++
	}
	for i, v := range vs {
		if t.cached(keys[i]) {
			continue
		}
		t.learn(keys[i])
		t.c.Reads++
		if v != nil {
			t.c.KeysRead++
			t.c.BytesRead += len(keys[i]) + len(v)
		}
	}
	return vs, err
}

func (t *tx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	kvs, err := t.r.GetRange(begin, end, opt)
	t.c.ReadRounds++
	t.c.Reads++
	for _, kv := range kvs {
		t.learn(kv.Key)
		t.c.KeysRead++
		t.c.BytesRead += len(kv.Key) + len(kv.Value)
	}
	return kvs, err
}

// ReadBatch counts one round trip for the points and ranges together, as
// FoundationDB's client issues them (storage.Batcher), whatever the inner
// transaction does.
func (t *tx) ReadBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	rounds := t.c.ReadRounds
	vals, err := t.GetMany(keys)
	if err != nil {
		return nil, nil, err
	}
	out := make([][]storage.KeyValue, len(ranges))
	for i, r := range ranges {
		if out[i], err = t.GetRange(r.Begin, r.End, r.Opt); err != nil {
			return nil, nil, err
		}
	}
	if t.c.ReadRounds > rounds {
		t.c.ReadRounds = rounds + 1
	}
	return vals, out, nil
}

func (t *tx) Set(key, value []byte) {
	t.c.KeysWritten++
	t.c.BytesWritten += len(key) + len(value)
	t.learn(key)
	t.w.Set(key, value)
}

func (t *tx) Clear(key []byte) {
	t.c.KeysWritten++
	t.c.BytesWritten += len(key)
	t.learn(key)
	t.w.Clear(key)
}

func (t *tx) ClearRange(begin, end []byte) {
	t.c.KeysWritten++
	t.c.BytesWritten += len(begin) + len(end)
	t.clear = append(t.clear, storage.KeyValue{Key: append([]byte(nil), begin...), Value: append([]byte(nil), end...)})
	t.w.ClearRange(begin, end)
}
