package faulty_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
	"github.com/fdb-etcd/fdb-etcd/storage/storagetest"
)

// inner opens the store the wrapper wraps: Pebble in memory.
func inner(t testing.TB) storage.DB {
	t.Helper()
	db, err := pebble.Open("db", pebble.Options{FS: vfs.NewMem(), NoSync: true, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatalf("pebble.Open: %v", err)
	}
	return db
}

func wrap(t testing.TB, o faulty.Options) *faulty.DB {
	t.Helper()
	d := faulty.Wrap(inner(t), o)
	t.Cleanup(func() { d.Close() })
	return d
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func get(t testing.TB, db storage.DB, key string) []byte {
	t.Helper()
	var v []byte
	if err := db.View(ctx(t), func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get([]byte(key))
		return err
	}); err != nil {
		t.Fatalf("View: %v", err)
	}
	return v
}

func count(t testing.TB, db storage.DB) int {
	t.Helper()
	var n int
	if err := db.View(ctx(t), func(tx storage.ReadTx) error {
		kvs, err := tx.GetRange(nil, []byte{0xff}, storage.RangeOptions{})
		n = len(kvs)
		return err
	}); err != nil {
		t.Fatalf("View: %v", err)
	}
	return n
}

func TestConformanceNoFaults(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.DB {
		return faulty.Wrap(inner(t), faulty.Options{})
	})
}

// TestConformanceWithFaults runs the whole suite with every fault on: the
// suite's transactions are written to be correct under them.
func TestConformanceWithFaults(t *testing.T) {
	var retries, unknowns, tooOld atomic.Int64
	seed := int64(0)
	storagetest.Run(t, func(t *testing.T) storage.DB {
		seed++
		d := faulty.Wrap(inner(t), faulty.Options{
			Seed:                     seed,
			RetryProbability:         0.2,
			CommitUnknownProbability: 0.2,
			TooOldProbability:        0.002,
		})
		t.Cleanup(func() {
			retries.Add(d.Stats.Retries.Load())
			unknowns.Add(d.Stats.Unknowns.Load())
			tooOld.Add(d.Stats.TooOld.Load())
		})
		return d
	})
	t.Logf("injected %d conflicts, %d commit-unknown results, %d too-old reads", retries.Load(), unknowns.Load(), tooOld.Load())
	if retries.Load() == 0 || unknowns.Load() == 0 || tooOld.Load() == 0 {
		t.Errorf("some fault was never injected: %d conflicts, %d unknown, %d too old", retries.Load(), unknowns.Load(), tooOld.Load())
	}
}

// --- limits ------------------------------------------------------------------

func TestLimits(t *testing.T) {
	big := func(n int) []byte { return bytes.Repeat([]byte{'k'}, n) }
	cases := []struct {
		name string
		fn   func(tx storage.Tx)
		want error
	}{
		{"key of MaxKeySize+1", func(tx storage.Tx) { tx.Set(big(storage.MaxKeySize+1), []byte("v")) }, storage.ErrKeyTooLarge},
		{"value of MaxValueSize+1", func(tx storage.Tx) { tx.Set([]byte("k"), big(storage.MaxValueSize+1)) }, storage.ErrValueTooLarge},
		{"over MaxTransactionBytes", func(tx storage.Tx) {
			for i := range storage.MaxTransactionBytes/storage.MaxValueSize + 1 {
				tx.Set([]byte("big/"+strconv.Itoa(i)), big(storage.MaxValueSize))
			}
		}, storage.ErrTransactionTooLarge},
		{"over MaxTransactionBytes in small writes and clears", func(tx storage.Tx) {
			for i := range 2000 {
				tx.Set([]byte("small/"+strconv.Itoa(i)), big(4000))
				tx.Clear(big(1000))
			}
		}, storage.ErrTransactionTooLarge},
		{"key of MaxKeySize", func(tx storage.Tx) { tx.Set(big(storage.MaxKeySize), []byte("v")) }, nil},
		{"value of MaxValueSize", func(tx storage.Tx) { tx.Set([]byte("k"), big(storage.MaxValueSize)) }, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := wrap(t, faulty.Options{})
			calls := 0
			err := d.Update(ctx(t), func(tx storage.Tx) error {
				calls++
				tx.Set([]byte("marker"), []byte("written in the same transaction"))
				c.fn(tx)
				return nil
			})
			if c.want == nil {
				if err != nil {
					t.Fatalf("Update = %v, want nil", err)
				}
				if get(t, d, "marker") == nil {
					t.Errorf("marker not committed")
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Update = %v, want %v", err, c.want)
			}
			if storage.Retryable(err) || calls != 1 {
				t.Errorf("limit error retried: fn ran %d times", calls)
			}
			if n := count(t, d); n != 0 {
				t.Errorf("%d keys committed by a failed transaction, want none", n)
			}
			if d.Stats.LimitErrors.Load() != 1 {
				t.Errorf("Stats.LimitErrors = %d, want 1", d.Stats.LimitErrors.Load())
			}
		})
	}
}

func TestLimitErrorIsSticky(t *testing.T) {
	// Like FDB's deferred error: after a failed write every read fails too.
	d := wrap(t, faulty.Options{})
	var readErr error
	err := d.Update(ctx(t), func(tx storage.Tx) error {
		tx.Set(bytes.Repeat([]byte{'k'}, storage.MaxKeySize+1), nil)
		_, readErr = tx.Get([]byte("k"))
		return nil
	})
	if !errors.Is(err, storage.ErrKeyTooLarge) || !errors.Is(readErr, storage.ErrKeyTooLarge) {
		t.Errorf("Update = %v, read after the failed Set = %v; want ErrKeyTooLarge for both", err, readErr)
	}
}

func TestOversizedKeysInReadsAndClears(t *testing.T) {
	// FoundationDB holds no key over MaxKeySize, so it answers reads of one as
	// absent, truncates range bounds, and makes Clear of one a no-op.
	d := wrap(t, faulty.Options{})
	k1 := bytes.Repeat([]byte{'a'}, storage.MaxKeySize)
	k2 := append(bytes.Repeat([]byte{'a'}, storage.MaxKeySize-1), 'b')
	long := bytes.Repeat([]byte{'a'}, storage.MaxKeySize+5)
	err := d.Update(ctx(t), func(tx storage.Tx) error {
		tx.Set(k1, []byte("1"))
		tx.Set(k2, []byte("2"))
		tx.Clear(long)
		v, err := tx.Get(long)
		if err != nil || v != nil {
			t.Errorf("Get of a %d-byte key = %q, %v; want absent", len(long), v, err)
		}
		kvs, err := tx.GetRange(long, []byte("b"), storage.RangeOptions{})
		if err != nil || len(kvs) != 1 || !bytes.Equal(kvs[0].Key, k2) {
			t.Errorf("GetRange from a %d-byte bound = %d pairs, %v; want only the key above it", len(long), len(kvs), err)
		}
		tx.ClearRange(long, []byte("b"))
		return nil
	})
	if err != nil {
		t.Fatalf("Update = %v, want nil", err)
	}
	if get(t, d, string(k1)) == nil || get(t, d, string(k2)) != nil {
		t.Errorf("ClearRange with oversized bounds: want k1 kept and k2 cleared")
	}
}

// --- transaction age -----------------------------------------------------------

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestTooOldIsRetried(t *testing.T) {
	clk := newClock()
	d := wrap(t, faulty.Options{Now: clk.Now})
	attempts := 0
	err := d.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		if _, err := tx.Get([]byte("k")); err != nil {
			return err
		}
		if attempts == 1 {
			clk.Advance(storage.MaxTransactionAge + time.Second) // a slow first attempt
			tx.Set([]byte("first-attempt"), []byte("x"))
		}
		tx.Set([]byte("k"), []byte(strconv.Itoa(attempts)))
		return nil
	})
	if err != nil {
		t.Fatalf("Update = %v, want nil after a retry", err)
	}
	if attempts != 2 {
		t.Errorf("fn ran %d times, want 2", attempts)
	}
	if v := get(t, d, "k"); string(v) != "2" {
		t.Errorf("k = %q, want the second attempt's value", v)
	}
	if get(t, d, "first-attempt") != nil {
		t.Errorf("the too-old attempt's write was committed")
	}
	if d.Stats.TooOld.Load() != 1 {
		t.Errorf("Stats.TooOld = %d, want 1", d.Stats.TooOld.Load())
	}
}

func TestTooOldRead(t *testing.T) {
	clk := newClock()
	d := wrap(t, faulty.Options{Now: clk.Now})
	var errs []error
	err := d.Update(ctx(t), func(tx storage.Tx) error {
		if _, err := tx.Get([]byte("a")); err != nil {
			return err
		}
		if len(errs) == 0 {
			clk.Advance(storage.MaxTransactionAge + time.Millisecond)
		}
		_, err := tx.GetRange([]byte("a"), []byte("b"), storage.RangeOptions{})
		errs = append(errs, err)
		return err
	})
	if err != nil {
		t.Fatalf("Update = %v", err)
	}
	if len(errs) != 2 || !errors.Is(errs[0], storage.ErrTransactionTooOld) || errs[1] != nil {
		t.Errorf("reads after 5 s returned %v, want [ErrTransactionTooOld <nil>]", errs)
	}
}

func TestTooOldIgnoresSwallowedError(t *testing.T) {
	// A read that failed with 1007 fails the commit too, even if fn ignores it.
	d := wrap(t, faulty.Options{TooOldProbability: 1})
	c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := d.Update(c, func(tx storage.Tx) error {
		tx.Get([]byte("k")) //nolint:errcheck // deliberately ignored
		tx.Set([]byte("k"), []byte("v"))
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Update = %v, want context.DeadlineExceeded", err)
	}
	d.SetOptions(faulty.Options{})
	if get(t, d, "k") != nil {
		t.Errorf("a transaction whose read failed with 1007 committed")
	}
}

func TestAgeCountsFromFirstRead(t *testing.T) {
	clk := newClock()
	d := wrap(t, faulty.Options{Now: clk.Now})
	for _, reads := range []bool{true, false} {
		attempts := 0
		err := d.Update(ctx(t), func(tx storage.Tx) error {
			attempts++
			clk.Advance(time.Hour) // before any read: no read version yet
			if reads {
				if _, err := tx.Get([]byte("k")); err != nil {
					return err
				}
			}
			tx.Set([]byte("k"), []byte("v"))
			return nil
		})
		if err != nil || attempts != 1 {
			t.Errorf("reads=%v: Update = %v after %d attempts, want nil after 1", reads, err, attempts)
		}
	}
}

func TestViewTooOld(t *testing.T) {
	clk := newClock()
	d := wrap(t, faulty.Options{Now: clk.Now})
	attempts := 0
	err := d.View(ctx(t), func(tx storage.ReadTx) error {
		attempts++
		if _, err := tx.Get([]byte("k")); err != nil {
			return err
		}
		if attempts == 1 {
			clk.Advance(storage.MaxTransactionAge + time.Second)
		}
		return nil
	})
	if err != nil || attempts != 2 {
		t.Errorf("View = %v after %d attempts, want nil after 2", err, attempts)
	}
}

func TestAlwaysTooOldEndsWithContext(t *testing.T) {
	clk := newClock()
	d := wrap(t, faulty.Options{Now: clk.Now})
	var attempts atomic.Int64
	c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- d.Update(c, func(tx storage.Tx) error {
			attempts.Add(1)
			if _, err := tx.Get([]byte("k")); err != nil {
				return err
			}
			clk.Advance(storage.MaxTransactionAge + time.Second)
			tx.Set([]byte("k"), []byte("v"))
			return nil
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Update = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("an always-too-old Update did not end with its context")
	}
	if attempts.Load() < 2 {
		t.Errorf("fn ran %d times, want it retried", attempts.Load())
	}
	if get(t, d, "k") != nil {
		t.Errorf("a too-old transaction committed")
	}
}

// --- injected faults -------------------------------------------------------------

func TestCommitUnknownRepeatsOnTopOfOwnWrites(t *testing.T) {
	d := wrap(t, faulty.Options{CommitUnknownProbability: 1})
	for i := range 3 {
		marker := []byte("marker/" + strconv.Itoa(i))
		var seen [][]byte // what each attempt found at the marker
		err := d.Update(ctx(t), func(tx storage.Tx) error {
			v, err := tx.Get(marker)
			if err != nil {
				return err
			}
			seen = append(seen, v)
			if v != nil {
				return nil // an earlier attempt landed
			}
			tx.Set(marker, []byte("attempt "+strconv.Itoa(len(seen))))
			n := 0
			if c, err := tx.Get([]byte("counter")); err != nil {
				return err
			} else if c != nil {
				n, _ = strconv.Atoi(string(c))
			}
			tx.Set([]byte("counter"), []byte(strconv.Itoa(n+1)))
			return nil
		})
		if err != nil {
			t.Fatalf("Update %d = %v, want nil", i, err)
		}
		if len(seen) < 2 {
			t.Fatalf("Update %d: fn ran %d times, want at least 2", i, len(seen))
		}
		if seen[0] != nil || string(seen[1]) != "attempt 1" {
			t.Errorf("Update %d: attempts saw markers %q; the second must see the first attempt's write", i, seen)
		}
	}
	if v := get(t, d, "counter"); string(v) != "3" {
		t.Errorf("counter = %q, want 3: the marker must keep each increment single", v)
	}
	if n := d.Stats.Unknowns.Load(); n != 3*faulty.MaxUnknownsPerUpdate {
		t.Errorf("Stats.Unknowns = %d, want %d", n, 3*faulty.MaxUnknownsPerUpdate)
	}

	// Without a marker the effect lands once per attempt: the hazard callers
	// must guard against.
	attempts := 0
	err := d.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		c, err := tx.Get([]byte("unguarded"))
		if err != nil {
			return err
		}
		tx.Set([]byte("unguarded"), append(c, 'x'))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := get(t, d, "unguarded"); len(v) != attempts || attempts != faulty.MaxUnknownsPerUpdate+1 {
		t.Errorf("unguarded append landed %d times in %d attempts, want %d in %d", len(v), attempts, faulty.MaxUnknownsPerUpdate+1, faulty.MaxUnknownsPerUpdate+1)
	}
}

func TestRetryDiscardsWrites(t *testing.T) {
	// An injected conflict rolls the attempt back: unlike commit-unknown, the
	// next attempt does not see its writes.
	d := wrap(t, faulty.Options{RetryProbability: 1})
	var seen [][]byte
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	go func() {
		for d.Stats.Retries.Load() < 3 && c.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		d.SetOptions(faulty.Options{}) // the conflicts stop
	}()
	err := d.Update(c, func(tx storage.Tx) error {
		v, err := tx.Get([]byte("k"))
		if err != nil {
			return err
		}
		seen = append(seen, v)
		tx.Set([]byte("k"), []byte("v"))
		return nil
	})
	if err != nil {
		t.Fatalf("Update = %v", err)
	}
	if len(seen) < 4 {
		t.Errorf("fn ran %d times, want at least 4", len(seen))
	}
	for i, v := range seen {
		if v != nil {
			t.Errorf("attempt %d saw %q from a rolled-back attempt", i+1, v)
		}
	}
	if string(get(t, d, "k")) != "v" {
		t.Errorf("k not committed after the conflicts stopped")
	}
}

func TestAlwaysConflictingEndsWithContext(t *testing.T) {
	d := wrap(t, faulty.Options{RetryProbability: 1})
	c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := d.Update(c, func(tx storage.Tx) error {
		tx.Set([]byte("k"), []byte("v"))
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Update = %v, want context.DeadlineExceeded", err)
	}
	if get(t, d, "k") != nil {
		t.Errorf("a conflicting transaction committed")
	}
}

// giveUp is an inner backend whose Update reports a retryable error without
// retrying it, once.
type giveUp struct {
	storage.DB
	once sync.Once
}

func (g *giveUp) Update(ctx context.Context, fn func(storage.Tx) error) error {
	var err error
	g.once.Do(func() { err = storage.ErrNotCommitted })
	if err != nil {
		return err
	}
	return g.DB.Update(ctx, fn)
}

func TestRetriesInnerRetryableError(t *testing.T) {
	in := inner(t)
	d := faulty.Wrap(&giveUp{DB: in}, faulty.Options{})
	defer d.Close()
	if err := d.Update(ctx(t), func(tx storage.Tx) error {
		tx.Set([]byte("k"), []byte("v"))
		return nil
	}); err != nil {
		t.Fatalf("Update = %v, want the retryable error retried", err)
	}
	if get(t, d, "k") == nil {
		t.Errorf("k not committed")
	}
}

func TestSetOptionsConcurrently(t *testing.T) {
	// Fault rates change while transactions run (the race detector watches).
	d := wrap(t, faulty.Options{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				err := d.Update(ctx(t), func(tx storage.Tx) error {
					if _, err := tx.Get([]byte("k")); err != nil {
						return err
					}
					tx.Set([]byte("k"+strconv.Itoa(w)), []byte(strconv.Itoa(i)))
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := range 50 {
		d.SetOptions(faulty.Options{Seed: int64(i), RetryProbability: 0.3, CommitUnknownProbability: 0.3, TooOldProbability: 0.1})
		time.Sleep(100 * time.Microsecond)
	}
	d.SetOptions(faulty.Options{})
	wg.Wait()
	for w := range 4 {
		if v := get(t, d, "k"+strconv.Itoa(w)); string(v) != "49" {
			t.Errorf("k%d = %q, want 49", w, v)
		}
	}
}
