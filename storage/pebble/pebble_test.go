package pebble_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
	"github.com/fdb-etcd/fdb-etcd/storage/storagetest"
)

// testOptions keep the block cache small: the suite opens many stores.
var testOptions = pebble.Options{CacheBytes: 8 << 20}

func open(t testing.TB, dir string, o pebble.Options) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return db
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.DB {
		return open(t, t.TempDir(), testOptions)
	})
}

func TestConformanceMemFS(t *testing.T) {
	if testing.Short() {
		t.Skip("the on-disk run covers the same code")
	}
	storagetest.Run(t, func(t *testing.T) storage.DB {
		o := testOptions
		o.FS = vfs.NewMem()
		return open(t, "db", o)
	})
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func key(i int) []byte { return fmt.Appendf(nil, "key/%06d", i) }

func value(i int) []byte {
	return fmt.Appendf(nil, "value-%d-%s", i, bytes.Repeat([]byte{byte('a' + i%26)}, i%200))
}

func set(t testing.TB, db storage.DB, kvs ...storage.KeyValue) {
	t.Helper()
	err := db.Update(ctx(t), func(tx storage.Tx) error {
		for _, kv := range kvs {
			tx.Set(kv.Key, kv.Value)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func readAll(t testing.TB, db storage.DB) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := db.View(ctx(t), func(tx storage.ReadTx) error {
		clear(out)
		kvs, err := tx.GetRange(nil, []byte{0xff}, storage.RangeOptions{})
		for _, kv := range kvs {
			out[string(kv.Key)] = string(kv.Value)
		}
		return err
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
	return out
}

func TestDurableAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	db := open(t, dir, testOptions)
	want := map[string]string{}
	for i := range 100 {
		set(t, db, storage.KeyValue{Key: key(i), Value: value(i)})
		want[string(key(i))] = string(value(i))
	}
	// A large value and a clear, so that reopen replays more than sets.
	big := bytes.Repeat([]byte("x"), storage.MaxValueSize)
	set(t, db, storage.KeyValue{Key: []byte("big"), Value: big})
	want["big"] = string(big)
	if err := db.Update(ctx(t), func(tx storage.Tx) error {
		tx.ClearRange(key(10), key(20))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 20; i++ {
		delete(want, string(key(i)))
	}
	if n, err := db.Size(); err != nil || n <= 0 {
		t.Errorf("Size() = %d, %v; want a positive size", n, err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	db = open(t, dir, testOptions)
	defer db.Close()
	got := readAll(t, db)
	if len(got) != len(want) {
		t.Errorf("after reopen: %d keys, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("after reopen: %q = %d bytes, want %d bytes", k, len(got[k]), len(v))
		}
	}
}

// crashRun runs concurrent writers on a crash-simulating filesystem, takes a
// crash image of it while they run, and returns the image and the writes that
// were acknowledged before it was taken.
func crashRun(t *testing.T, o pebble.Options, cfg vfs.CrashCloneCfg) (image *vfs.MemFS, acked []int) {
	fs := vfs.NewCrashableMem()
	o.FS = fs
	db := open(t, "db", o)

	const writers = 4
	var (
		mu    sync.Mutex
		done  []int
		next  atomic.Int64
		stop  atomic.Bool
		wg    sync.WaitGroup
		count atomic.Int64
	)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				i := int(next.Add(1))
				// Two keys per transaction: after the crash both or neither.
				err := db.Update(context.Background(), func(tx storage.Tx) error {
					tx.Set(key(i), value(i))
					tx.Set(append([]byte("pair/"), key(i)...), value(i))
					return nil
				})
				if errors.Is(err, storage.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Update %d: %v", i, err)
					return
				}
				mu.Lock()
				done = append(done, i)
				mu.Unlock()
				count.Add(1)
			}
		}()
	}
	for count.Load() < 300 {
		time.Sleep(time.Millisecond)
	}
	// Everything acknowledged before the crash must survive it. Writers keep
	// going while the image is taken.
	mu.Lock()
	acked = append(acked, done...)
	mu.Unlock()
	image = fs.CrashClone(cfg)
	stop.Store(true)
	wg.Wait()
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return image, acked
}

func checkCrashImage(t *testing.T, image *vfs.MemFS, o pebble.Options, acked []int) (lost int) {
	t.Helper()
	o.FS = image
	db := open(t, "db", o)
	defer db.Close()
	got := readAll(t, db)
	for _, i := range acked {
		if got[string(key(i))] != string(value(i)) {
			lost++
		}
	}
	for k, v := range got {
		if bytes.HasPrefix([]byte(k), []byte("pair/")) {
			if got[k[len("pair/"):]] != v {
				t.Errorf("after crash: %q present without its pair: a transaction was torn", k)
			}
			continue
		}
		if got["pair/"+k] != v {
			t.Errorf("after crash: %q present without its pair: a transaction was torn", k)
		}
	}
	t.Logf("%d acknowledged writes, %d keys after crash, %d lost", len(acked), len(got)/2, lost)
	return lost
}

func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	for _, pct := range []int{0, 50} {
		t.Run(fmt.Sprintf("unsynced=%d%%", pct), func(t *testing.T) {
			cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
			if pct > 0 {
				cfg.RNG = rand.New(rand.NewPCG(uint64(pct), 1))
			}
			image, acked := crashRun(t, testOptions, cfg)
			if lost := checkCrashImage(t, image, testOptions, acked); lost > 0 {
				t.Errorf("%d of %d acknowledged Updates lost in the crash", lost, len(acked))
			}
		})
	}
}

// TestCrashWithoutSyncLoses is the control for the test above: with NoSync
// the same crash loses acknowledged writes, so the simulation is real.
func TestCrashWithoutSyncLoses(t *testing.T) {
	o := testOptions
	o.NoSync = true
	image, acked := crashRun(t, o, vfs.CrashCloneCfg{})
	if lost := checkCrashImage(t, image, o, acked); lost == 0 {
		t.Errorf("no acknowledged write lost without fsync: the crash simulation checks nothing")
	}
}

func TestUseAfterCloseDoesNotPanic(t *testing.T) {
	// Pebble panics when used after Close; the backend must turn that into
	// ErrClosed, including for calls racing with Close.
	for range 20 {
		db := open(t, t.TempDir(), pebble.Options{CacheBytes: 1 << 20, NoSync: true})
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for {
					err := db.View(context.Background(), func(tx storage.ReadTx) error {
						_, err := tx.Get([]byte("k"))
						return err
					})
					werr := db.WaitChange(context.Background(), []byte("k"), []byte("x"))
					_, serr := db.Size()
					uerr := db.Update(context.Background(), func(tx storage.Tx) error {
						tx.Set([]byte("k"), []byte("v"))
						return nil
					})
					if errors.Is(err, storage.ErrClosed) && errors.Is(werr, storage.ErrClosed) &&
						errors.Is(serr, storage.ErrClosed) && errors.Is(uerr, storage.ErrClosed) {
						return
					}
				}
			}()
		}
		close(start)
		time.Sleep(time.Millisecond)
		if err := db.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
	}
}

func TestPanicInTransactionReleasesStore(t *testing.T) {
	// A panicking fn must not keep the write lock or leave Close waiting.
	db := open(t, t.TempDir(), pebble.Options{CacheBytes: 1 << 20, NoSync: true})
	mustPanic := func(f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("fn's panic was swallowed")
			}
		}()
		f()
	}
	mustPanic(func() {
		db.Update(context.Background(), func(tx storage.Tx) error {
			tx.Set([]byte("k"), []byte("v"))
			panic("boom")
		})
	})
	mustPanic(func() {
		db.View(context.Background(), func(tx storage.ReadTx) error { panic("boom") })
	})
	set(t, db, storage.KeyValue{Key: []byte("after"), Value: []byte("v")})
	if got := readAll(t, db); len(got) != 1 || got["after"] != "v" {
		t.Errorf("store after panics = %q, want only after=v", got)
	}
	done := make(chan error, 1)
	go func() { done <- db.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Close hangs after a transaction panicked")
	}
}

func benchDB(b *testing.B, noSync bool) *pebble.DB {
	db := open(b, b.TempDir(), pebble.Options{NoSync: noSync})
	b.Cleanup(func() { db.Close() })
	return db
}

// BenchmarkUpdateSmall measures one small durable write per transaction, the
// shape of an etcd Put.
func BenchmarkUpdateSmall(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("nosync=%v", noSync), func(b *testing.B) {
			db := benchDB(b, noSync)
			v := bytes.Repeat([]byte("v"), 100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				err := db.Update(context.Background(), func(tx storage.Tx) error {
					tx.Set(key(i), v)
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpdateSmallParallel shows how serialised writers scale.
func BenchmarkUpdateSmallParallel(b *testing.B) {
	db := benchDB(b, false)
	v := bytes.Repeat([]byte("v"), 100)
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(n.Add(1))
			err := db.Update(context.Background(), func(tx storage.Tx) error {
				tx.Set(key(i), v)
				return nil
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGetRange reads 100 consecutive pairs out of 10,000 in a View.
func BenchmarkGetRange(b *testing.B) {
	db := benchDB(b, true)
	const n = 10_000
	for lo := 0; lo < n; lo += 1000 {
		err := db.Update(context.Background(), func(tx storage.Tx) error {
			for i := lo; i < lo+1000; i++ {
				tx.Set(key(i), value(i))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, limit := range []int{1, 100} {
		for _, rev := range []bool{false, true} {
			b.Run(fmt.Sprintf("limit=%d/reverse=%v", limit, rev), func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					lo := (i * 7919) % (n - limit)
					err := db.View(context.Background(), func(tx storage.ReadTx) error {
						kvs, err := tx.GetRange(key(lo), key(n), storage.RangeOptions{Limit: limit, Reverse: rev})
						if err == nil && len(kvs) != limit {
							err = fmt.Errorf("got %d pairs, want %d", len(kvs), limit)
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestSizeFallsAfterDefragment: etcd's way out of a NOSPACE alarm is to
// delete, compact and defragment until the size is below the quota again,
// so the size must count live data only, and fall once deleted data is
// gone: not the WAL files Pebble keeps for reuse, which grow with every
// memtable flushed.
func TestSizeFallsAfterDefragment(t *testing.T) {
	db := open(t, t.TempDir(), testOptions)
	defer db.Close()
	big := bytes.Repeat([]byte("v"), 90_000)
	for round := range 3 {
		for i := range 40 {
			set(t, db, storage.KeyValue{Key: key(i), Value: big})
		}
		if n, err := db.Size(); err != nil || n < 40*90_000 {
			t.Fatalf("round %d: Size() = %d, %v after writing 3.6 MB", round, n, err)
		}
		if err := db.Update(ctx(t), func(tx storage.Tx) error {
			tx.ClearRange(key(0), key(40))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Defragment(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if n, err := db.Size(); err != nil || n > 64<<10 {
			t.Fatalf("round %d: Size() = %d, %v after deleting everything and defragmenting, want < 64 KiB", round, n, err)
		}
	}
}
