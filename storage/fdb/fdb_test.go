//go:build fdb

package fdb_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
	"github.com/fdb-etcd/fdb-etcd/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(fdbtest.Main(m)) }

// TestConformance runs the storage conformance suite, each test in a fresh
// keyspace of its own on the real cluster.
func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) storage.DB { return fdbtest.Open(t) })
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func set(t testing.TB, db storage.DB, key, value string) {
	t.Helper()
	if err := db.Update(ctx(t), func(tx storage.Tx) error {
		tx.Set([]byte(key), []byte(value))
		return nil
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
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

func fdbCode(err error) int {
	var fe fdbgo.Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	return 0
}

// TestErrorMapping writes what FoundationDB refuses and checks the storage
// errors (and FoundationDB's codes) come back, with nothing committed.
func TestErrorMapping(t *testing.T) {
	db := fdbtest.Open(t)
	cases := []struct {
		name  string
		write func(tx storage.Tx)
		want  error
		code  int
	}{
		{"KeyTooLarge", func(tx storage.Tx) {
			tx.Set(bytes.Repeat([]byte("k"), storage.MaxKeySize+storage.MaxNestingBytes+1), []byte("v"))
		}, storage.ErrKeyTooLarge, 2102},
		{"ValueTooLarge", func(tx storage.Tx) {
			tx.Set([]byte("k"), bytes.Repeat([]byte("v"), storage.MaxValueSize+1))
		}, storage.ErrValueTooLarge, 2103},
		{"TransactionTooLarge", func(tx storage.Tx) {
			v := bytes.Repeat([]byte("v"), storage.MaxValueSize)
			for i := range storage.MaxTransactionBytes/storage.MaxValueSize + 2 {
				tx.Set([]byte("big/"+strconv.Itoa(i)), v)
			}
		}, storage.ErrTransactionTooLarge, 2101},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			err := db.Update(ctx(t), func(tx storage.Tx) error {
				calls++
				tx.Set([]byte("k"), []byte("small")) // must not land either
				c.write(tx)
				return nil
			})
			if !errors.Is(err, c.want) {
				t.Fatalf("Update = %v, want errors.Is %v", err, c.want)
			}
			if got := fdbCode(err); got != c.code {
				t.Errorf("FoundationDB code in %v = %d, want %d", err, got, c.code)
			}
			if storage.Retryable(err) {
				t.Errorf("%v is retryable", err)
			}
			if calls != 1 {
				t.Errorf("fn ran %d times for a non-retryable error, want 1", calls)
			}
			if v := get(t, db, "k"); v != nil {
				t.Errorf("Get(k) = %q after a failed Update, want absent", v)
			}
		})
	}
	// The largest key and value are fine, and so are reads of longer keys.
	key := bytes.Repeat([]byte("k"), storage.MaxKeySize)
	val := bytes.Repeat([]byte("v"), storage.MaxValueSize)
	if err := db.Update(ctx(t), func(tx storage.Tx) error {
		tx.Set(key, val)
		v, err := tx.Get(append(bytes.Clone(key), 'k'))
		if err == nil && v != nil {
			t.Errorf("Get of an over-long key = %d bytes, want absent", len(v))
		}
		return err
	}); err != nil {
		t.Fatalf("Update of the largest key and value: %v", err)
	}
	if v := get(t, db, string(key)); !bytes.Equal(v, val) {
		t.Errorf("largest key read back %d bytes, want %d", len(v), len(val))
	}
}

// TestWaitChangeOtherClient: a commit through another handle on the same
// keyspace (as another fdb-etcd process would make it) wakes a waiter.
func TestWaitChangeOtherClient(t *testing.T) {
	name := fdbtest.NewPrefix(t)
	a, b := fdbtest.OpenPrefix(t, name), fdbtest.OpenPrefix(t, name)
	set(t, a, "head", "1")
	for i := 2; i <= 6; i++ {
		seen := []byte(strconv.Itoa(i - 1))
		done := make(chan error, 1)
		go func() { done <- a.WaitChange(ctx(t), []byte("head"), seen) }()
		select {
		case err := <-done:
			t.Fatalf("WaitChange returned %v before the change", err)
		case <-time.After(50 * time.Millisecond):
		}
		start := time.Now()
		set(t, b, "head", strconv.Itoa(i))
		committed := time.Now()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("WaitChange: %v", err)
			}
			t.Logf("woken %v after the commit returned (%v after it started)", time.Since(committed), time.Since(start))
		case <-time.After(10 * time.Second):
			t.Fatalf("WaitChange not woken by a commit from another handle")
		}
	}
}

// TestConflictRetried: a read-write conflict makes FoundationDB refuse the
// commit (1020); Update runs fn again on fresh data.
func TestConflictRetried(t *testing.T) {
	db := fdbtest.Open(t)
	set(t, db, "n", "0")
	attempts := 0
	err := db.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		v, err := tx.Get([]byte("n"))
		if err != nil {
			return err
		}
		if attempts == 1 {
			// Another transaction changes what this one read.
			set(t, db, "n", "10")
		}
		n, _ := strconv.Atoi(string(v))
		tx.Set([]byte("n"), []byte(strconv.Itoa(n+1)))
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if attempts != 2 {
		t.Errorf("fn ran %d times, want 2 (one conflict)", attempts)
	}
	if v := get(t, db, "n"); string(v) != "11" {
		t.Errorf("n = %q, want 11", v)
	}
}

// TestCommitUnknownResult: after a commit reported as 1021 Update runs fn
// again; fn finds its marker and the effect lands once.
func TestCommitUnknownResult(t *testing.T) {
	db := fdbtest.Open(t)
	var unknowns atomic.Int64
	fdb.SetCommitHook(db, func() error {
		if unknowns.Add(1) <= 2 {
			return fdbgo.Error{Code: 1021}
		}
		return nil
	})
	attempts, replays := 0, 0
	err := db.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		marker, err := tx.Get([]byte("marker/1"))
		if err != nil {
			return err
		}
		if marker != nil {
			replays++
			return nil
		}
		v, err := tx.Get([]byte("n"))
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(string(v))
		tx.Set([]byte("n"), []byte(strconv.Itoa(n+1)))
		tx.Set([]byte("marker/1"), []byte{})
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if attempts != 3 || replays != 2 {
		t.Errorf("fn ran %d times (%d found the marker), want 3 (2)", attempts, replays)
	}
	if v := get(t, db, "n"); string(v) != "1" {
		t.Errorf("n = %q, want 1: the batch landed more than once", v)
	}
}

// TestCommitUnknownThenDeadline: when the context ends while Update is still
// retrying after a 1021, the error says both.
func TestCommitUnknownThenDeadline(t *testing.T) {
	db := fdbtest.Open(t)
	fdb.SetCommitHook(db, func() error { return fdbgo.Error{Code: 1021} })
	c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := db.Update(c, func(tx storage.Tx) error {
		tx.Set([]byte("k"), []byte("v"))
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, storage.ErrCommitUnknownResult) {
		t.Errorf("Update = %v, want context.DeadlineExceeded and storage.ErrCommitUnknownResult", err)
	}
}

// TestRetriesBounded: a function that keeps failing retryably is given up on
// after MaxRetries even without a deadline.
func TestRetriesBounded(t *testing.T) {
	db, err := fdb.Open(fdb.Options{ClusterFile: fdbtest.ClusterFile(t), Prefix: fdbtest.NewPrefix(t), MaxRetries: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	attempts := 0
	err = db.Update(context.Background(), func(tx storage.Tx) error {
		attempts++
		return storage.ErrNotCommitted
	})
	if !errors.Is(err, storage.ErrNotCommitted) || !strings.Contains(err.Error(), "giving up") {
		t.Errorf("Update = %v, want giving up with ErrNotCommitted", err)
	}
	if attempts != 4 {
		t.Errorf("fn ran %d times, want 4 (3 retries)", attempts)
	}
}

// TestKeyspaces: keyspaces with the same keys, one name a prefix of the
// other's, are independent, and keys are stored under the documented prefix.
func TestKeyspaces(t *testing.T) {
	base := fdbtest.NewPrefix(t)
	other := base + "x"
	a, b := fdbtest.OpenPrefix(t, base), fdbtest.OpenPrefix(t, other)
	t.Cleanup(func() {
		_ = b.Update(context.Background(), func(tx storage.Tx) error {
			tx.ClearRange(nil, bytes.Repeat([]byte{0xff}, storage.MaxKeySize+1))
			return nil
		})
	})
	set(t, a, "k", "a")
	set(t, b, "k", "b")
	set(t, a, "x", "a") // base+"x" must not collide with other's ""
	if v := get(t, a, "k"); string(v) != "a" {
		t.Errorf("a: k = %q", v)
	}
	if v := get(t, b, "k"); string(v) != "b" {
		t.Errorf("b: k = %q", v)
	}
	var kvs []storage.KeyValue
	if err := b.View(ctx(t), func(tx storage.ReadTx) error {
		var err error
		kvs, err = tx.GetRange(nil, []byte{0xff}, storage.RangeOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(kvs) != 1 || string(kvs[0].Key) != "k" {
		t.Errorf("keyspace %q holds %d keys, want only its own k", other, len(kvs))
	}

	// The raw layout, through a client of its own.
	want := append([]byte{0x02}, base...)
	want = append(want, 0x00, 'k')
	if got := append(fdb.KeyPrefix(base), 'k'); !bytes.Equal(got, want) {
		t.Errorf("KeyPrefix(%q)+k = %q, want %q", base, got, want)
	}
	cs, err := os.ReadFile(fdbtest.ClusterFile(t))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fdbgo.OpenWithConnectionString(strings.TrimSpace(string(cs)))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	v, err := raw.ReadTransact(func(tr fdbgo.ReadTransaction) (any, error) {
		return tr.Get(fdbgo.Key(want)).Get()
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v.([]byte), []byte("a")) {
		t.Errorf("raw key %q = %q, want \"a\"", want, v)
	}
}

func TestOpenOptions(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	// The API version is per process: the one in use is fine, another is not.
	db, err := fdb.Open(fdb.Options{ClusterFile: cf, Prefix: "fdbtest/open", APIVersion: fdb.DefaultAPIVersion})
	if err != nil {
		t.Fatalf("second Open with the same API version: %v", err)
	}
	db.Close()
	if _, err := fdb.Open(fdb.Options{ClusterFile: cf, Prefix: "fdbtest/open", APIVersion: 720}); err == nil || !strings.Contains(err.Error(), "already selected") {
		t.Errorf("Open with another API version = %v, want an error saying one is already selected", err)
	}
	if _, err := fdb.Open(fdb.Options{ClusterFile: cf, Prefix: strings.Repeat("p", fdb.MaxPrefixBytes)}); err == nil {
		t.Errorf("Open with an over-long prefix succeeded")
	}
}

// recorder is an Observer that counts what it is told.
type recorder struct {
	mu sync.Mutex
	observed
}

type observed struct {
	retries               map[int]int
	commits, readVersions int
	recoveries            int
}

func (r *recorder) ObserveFDBRetry(code int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retries == nil {
		r.retries = map[int]int{}
	}
	r.retries[code]++
}

func (r *recorder) ObserveFDBCommit(time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.commits++
}

func (r *recorder) ObserveFDBReadVersion(time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.readVersions++
}

func (r *recorder) ObserveFDBRecovery() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recoveries++
}

func (r *recorder) snapshot() observed {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.observed
	o.retries = maps.Clone(r.retries)
	return o
}

// TestObserver: every attempt reports its read version, every commit its
// latency, every retry FoundationDB's error code.
func TestObserver(t *testing.T) {
	db := fdbtest.Open(t)
	var rec recorder
	db.SetObserver(&rec)
	set(t, db, "n", "0")
	_ = get(t, db, "n")
	if got := rec.snapshot(); got.readVersions != 2 || got.commits != 1 || len(got.retries) != 0 {
		t.Fatalf("one Update and one View observed as %d read versions, %d commits, retries %v; want 2, 1, none", got.readVersions, got.commits, got.retries)
	}
	attempts := 0
	if err := db.Update(ctx(t), func(tx storage.Tx) error {
		attempts++
		if _, err := tx.Get([]byte("n")); err != nil {
			return err
		}
		if attempts == 1 {
			set(t, db, "n", "1") // a conflict: FoundationDB refuses the commit with 1020
		}
		tx.Set([]byte("n"), []byte("2"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := rec.snapshot()
	if got.retries[1020] != 1 || len(got.retries) != 1 {
		t.Errorf("retries by code after one conflict = %v, want map[1020:1]", got.retries)
	}
	if got.recoveries != 0 {
		t.Errorf("%d recoveries observed on a cluster that did not recover", got.recoveries)
	}
	db.SetObserver(nil)
	set(t, db, "n", "3")
	if after := rec.snapshot(); after.commits != got.commits {
		t.Errorf("observed a commit after SetObserver(nil)")
	}
}

// TestRecoverySeen forces recoveries of a cluster of its own and expects
// each to be observed once, and none while the cluster only idles.
func TestRecoverySeen(t *testing.T) {
	fdbtest.ClusterFile(t) // skips or fails like the other tests without FoundationDB
	c, err := fdbserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(t.Failed()) }()
	db, err := fdb.Open(fdb.Options{ClusterFile: c.ClusterFile(), Prefix: fdbtest.NewPrefix(t) + "/recovery"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rec recorder
	db.SetObserver(&rec)
	set(t, db, "k", "0")
	time.Sleep(2 * time.Second) // versions advance with time, and that is no recovery
	set(t, db, "k", "1")
	if n := rec.snapshot().recoveries; n != 0 {
		t.Fatalf("%d recoveries observed before any", n)
	}
	for i := 1; i <= 2; i++ {
		if err := c.ForceRecovery(ctx(t)); err != nil {
			t.Fatal(err)
		}
		set(t, db, "k", strconv.Itoa(i+1))
		if n := rec.snapshot().recoveries; n != i {
			t.Fatalf("after %d forced recoveries %d were observed", i, n)
		}
	}
}

// TestClientBuggifyPerProcess: client buggify is a network option, chosen
// by the process's first Open; another choice later is refused.
func TestClientBuggifyPerProcess(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	_, err := fdb.Open(fdb.Options{ClusterFile: cf, Prefix: "fdbtest/buggify", ClientBuggify: fdb.ClientBuggify{Enable: true}})
	if err == nil || !strings.Contains(err.Error(), "already chosen") {
		t.Errorf("Open with client buggify after the network started = %v, want an error saying it was already chosen", err)
	}
}
