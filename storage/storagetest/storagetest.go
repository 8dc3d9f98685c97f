// Package storagetest is the conformance suite every storage.DB backend must
// pass. A backend's tests call
//
//	storagetest.Run(t, func(t *testing.T) storage.DB { return openFreshEmptyDB(t) })
//
// Every test opens its own database and the suite closes it.
//
// The suite holds to the contract in package storage, and it is written the
// way callers must write against it: transaction functions return read errors
// instead of failing the test, make no assumption about how often they run,
// and mark their effects so that a commit reported as unknown (and then
// repeated) lands once. It therefore also passes on backends that inject
// conflicts, commit-unknown results and too-old transactions (see
// storage/faulty), as long as they do so with a probability below 1.
package storagetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Opener returns a fresh, empty database. The suite closes it.
type Opener func(t *testing.T) storage.DB

type test struct {
	name string
	fn   func(t *testing.T, db storage.DB)
}

// Tests lists the names of the conformance tests, in the order Run runs them
// (each is a subtest of the test calling Run).
func Tests() []string {
	names := make([]string, len(tests))
	for i, tc := range tests {
		names[i] = tc.name
	}
	return names
}

var tests = []test{
	{"GetAbsent", testGetAbsent},
	{"SetGetClear", testSetGetClear},
	{"EmptyValue", testEmptyValue},
	{"SlicesOwnedByCaller", testSlicesOwned},
	{"GetMany", testGetMany},
	{"GetManySorted", testGetManySorted},
	{"ReadBatch", testReadBatch},
	{"GetRange", testGetRange},
	{"GetRangePaging", testGetRangePaging},
	{"Scanner", testScanner},
	{"Scan", testScan},
	{"Snapshotter", testSnapshotter},
	{"KeyOrder", testKeyOrder},
	{"ClearRange", testClearRange},
	{"ReadYourWrites", testReadYourWrites},
	{"Rollback", testRollback},
	{"RetryableErrorFromFn", testRetryableErrorFromFn},
	{"IdempotentRepeats", testIdempotentRepeats},
	{"ViewRetries", testViewRetries},
	{"RetryEndsWithContext", testRetryEndsWithContext},
	{"CanceledContext", testCanceledContext},
	{"ViewSnapshot", testViewSnapshot},
	{"ViewConsistentUnderWrites", testViewConsistentUnderWrites},
	{"SerializableCounter", testSerializableCounter},
	{"SerializableWriteSkew", testWriteSkew},
	{"MaxSizes", testMaxSizes},
	{"LargeTransaction", testLargeTransaction},
	{"WaitChangeImmediate", testWaitChangeImmediate},
	{"RecentViewMonotonic", testRecentViewMonotonic},
	{"WaitChangeBlocksUntilCommit", testWaitChangeBlocks},
	{"WaitChangeAbsent", testWaitChangeAbsent},
	{"WaitChangeContext", testWaitChangeContext},
	{"WaitChangeLoop", testWaitChangeLoop},
	{"WaitChangeOwnCommit", testWaitChangeOwnCommit},
	{"Closed", testClosed},
	{"CloseWakesWaiters", testCloseWakesWaiters},
	{"CloseWhileBusy", testCloseWhileBusy},
	{"Sizer", testSizer},
	{"Strinc", testStrinc},
}

// Run runs every conformance test as a subtest of t.
func Run(t *testing.T, open Opener) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db := open(t)
			t.Cleanup(func() {
				if err := db.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, db)
		})
	}
}

// --- helpers -----------------------------------------------------------------

// opTimeout bounds every call the suite makes, so that a hanging backend fails
// instead of stalling the whole run.
const opTimeout = 30 * time.Second

// quiet is how long the suite watches a call that must block.
const quiet = 100 * time.Millisecond

var (
	errRollback = errors.New("storagetest: deliberate rollback")
	all         = []byte{}     // smallest key
	allEnd      = []byte{0xff} // end of the normal key space
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func b(s string) []byte { return []byte(s) }

func update(t *testing.T, db storage.DB, fn func(tx storage.Tx) error) {
	t.Helper()
	if err := db.Update(testCtx(t), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func view(t *testing.T, db storage.DB, fn func(tx storage.ReadTx) error) {
	t.Helper()
	if err := db.View(testCtx(t), fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

// put commits key/value pairs given as alternating strings.
func put(t *testing.T, db storage.DB, kv ...string) {
	t.Helper()
	update(t, db, func(tx storage.Tx) error {
		for i := 0; i < len(kv); i += 2 {
			tx.Set(b(kv[i]), b(kv[i+1]))
		}
		return nil
	})
}

func get(t *testing.T, db storage.DB, key string) []byte {
	t.Helper()
	var v []byte
	view(t, db, func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get(b(key))
		return err
	})
	return v
}

// dump returns the whole normal key space.
func dump(t *testing.T, db storage.DB) []storage.KeyValue {
	t.Helper()
	var kvs []storage.KeyValue
	view(t, db, func(tx storage.ReadTx) error {
		var err error
		kvs, err = tx.GetRange(all, allEnd, storage.RangeOptions{})
		return err
	})
	return kvs
}

// kvs builds pairs from alternating strings.
func kvs(kv ...string) []storage.KeyValue {
	out := make([]storage.KeyValue, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		out = append(out, storage.KeyValue{Key: b(kv[i]), Value: b(kv[i+1])})
	}
	return out
}

func sameKVs(got, want []storage.KeyValue) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) {
			return false
		}
	}
	return true
}

func fmtKVs(kvs []storage.KeyValue) string {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, kv := range kvs {
		if i > 0 {
			buf.WriteByte(' ')
		}
		fmt.Fprintf(&buf, "%s=%s", short(kv.Key), short(kv.Value))
	}
	buf.WriteByte(']')
	return buf.String()
}

func short(v []byte) string {
	if len(v) > 24 {
		return fmt.Sprintf("%q...(%d bytes)", v[:16], len(v))
	}
	return strconv.Quote(string(v))
}

func wantKVs(t *testing.T, what string, got, want []storage.KeyValue) {
	t.Helper()
	if !sameKVs(got, want) {
		t.Errorf("%s:\n got %s\nwant %s", what, fmtKVs(got), fmtKVs(want))
	}
}

func wantValue(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	if got == nil || string(got) != want {
		t.Errorf("%s = %s, want %q", what, fmtValue(got), want)
	}
}

func wantAbsent(t *testing.T, what string, got []byte) {
	t.Helper()
	if got != nil {
		t.Errorf("%s = %s, want absent (nil)", what, fmtValue(got))
	}
}

func fmtValue(v []byte) string {
	if v == nil {
		return "nil"
	}
	return short(v)
}

// model computes what GetRange must return over a set of committed pairs.
func model(state map[string]string, begin, end []byte, opt storage.RangeOptions) []storage.KeyValue {
	var keys []string
	for k := range state {
		if bytes.Compare(b(k), begin) >= 0 && bytes.Compare(b(k), end) < 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // Go string order is byte order
	if opt.Reverse {
		slices.Reverse(keys)
	}
	if opt.Limit > 0 && len(keys) > opt.Limit {
		keys = keys[:opt.Limit]
	}
	out := make([]storage.KeyValue, 0, len(keys))
	for _, k := range keys {
		out = append(out, storage.KeyValue{Key: b(k), Value: b(state[k])})
	}
	return out
}

// returnsWithin runs f in a goroutine and reports its result, or fails the
// test when it has not returned after d.
func returnsWithin(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

// --- basic reads and writes --------------------------------------------------

func testGetAbsent(t *testing.T, db storage.DB) {
	view(t, db, func(tx storage.ReadTx) error {
		v, err := tx.Get(b("missing"))
		if err != nil {
			return err
		}
		wantAbsent(t, "View Get(missing)", v)
		vs, err := tx.GetMany([][]byte{b("missing"), b("")})
		if err != nil {
			return err
		}
		if len(vs) != 2 || vs[0] != nil || vs[1] != nil {
			t.Errorf("GetMany of absent keys = %q, want [nil nil]", vs)
		}
		kvs, err := tx.GetRange(all, allEnd, storage.RangeOptions{})
		if err != nil {
			return err
		}
		wantKVs(t, "GetRange of empty store", kvs, nil)
		return nil
	})
	update(t, db, func(tx storage.Tx) error {
		v, err := tx.Get(b("missing"))
		if err != nil {
			return err
		}
		wantAbsent(t, "Update Get(missing)", v)
		return nil
	})
}

func testSetGetClear(t *testing.T, db storage.DB) {
	put(t, db, "k1", "v1", "k2", "v2")
	wantValue(t, "Get(k1)", get(t, db, "k1"), "v1")
	wantValue(t, "Get(k2)", get(t, db, "k2"), "v2")

	update(t, db, func(tx storage.Tx) error {
		tx.Clear(b("k1"))
		tx.Set(b("k2"), b("v2'"))
		tx.Clear(b("never-there")) // clearing an absent key is fine
		return nil
	})
	wantAbsent(t, "Get(k1) after Clear", get(t, db, "k1"))
	wantValue(t, "Get(k2) after overwrite", get(t, db, "k2"), "v2'")
	wantKVs(t, "all keys", dump(t, db), kvs("k2", "v2'"))

	// Set after Clear in one transaction: the last write wins.
	update(t, db, func(tx storage.Tx) error {
		tx.Clear(b("k3"))
		tx.Set(b("k3"), b("v3"))
		tx.Set(b("k2"), b("x"))
		tx.Clear(b("k2"))
		return nil
	})
	wantValue(t, "Get(k3) after Clear+Set", get(t, db, "k3"), "v3")
	wantAbsent(t, "Get(k2) after Set+Clear", get(t, db, "k2"))

	// The empty key is a key like any other.
	put(t, db, "", "empty-key")
	wantValue(t, `Get("")`, get(t, db, ""), "empty-key")
	wantKVs(t, "all keys", dump(t, db), kvs("", "empty-key", "k3", "v3"))
}

func testEmptyValue(t *testing.T, db storage.DB) {
	update(t, db, func(tx storage.Tx) error {
		tx.Set(b("empty"), []byte{})
		tx.Set(b("nil"), nil)
		return nil
	})
	for _, k := range []string{"empty", "nil"} {
		v := get(t, db, k)
		if v == nil || len(v) != 0 {
			t.Errorf("Get(%q) = %s, want a non-nil empty value (nil means absent)", k, fmtValue(v))
		}
	}
	view(t, db, func(tx storage.ReadTx) error {
		vs, err := tx.GetMany([][]byte{b("empty"), b("absent"), b("nil")})
		if err != nil {
			return err
		}
		if len(vs) != 3 || vs[0] == nil || len(vs[0]) != 0 || vs[1] != nil || vs[2] == nil || len(vs[2]) != 0 {
			t.Errorf("GetMany(empty, absent, nil) = %#v, want [[] nil []]", vs)
		}
		return nil
	})
	wantKVs(t, "all keys", dump(t, db), kvs("empty", "", "nil", ""))
}

func testSlicesOwned(t *testing.T, db storage.DB) {
	// Set must not keep the caller's buffers: callers reuse them.
	update(t, db, func(tx storage.Tx) error {
		k, v := b("key"), b("value")
		tx.Set(k, v)
		copy(k, "XXX")
		copy(v, "XXXXX")
		return nil
	})
	wantKVs(t, "after mutating the buffers passed to Set", dump(t, db), kvs("key", "value"))

	// Returned slices belong to the caller.
	view(t, db, func(tx storage.ReadTx) error {
		v, err := tx.Get(b("key"))
		if err != nil {
			return err
		}
		if v != nil {
			copy(v, "YYYYY")
		}
		vs, err := tx.GetMany([][]byte{b("key")})
		if err != nil {
			return err
		}
		if len(vs) == 1 && vs[0] != nil {
			copy(vs[0], "ZZZZZ")
		}
		kvs, err := tx.GetRange(all, allEnd, storage.RangeOptions{})
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			copy(kv.Key, "WWW")
			copy(kv.Value, "WWWWW")
		}
		return nil
	})
	wantValue(t, "Get(key) after mutating returned slices", get(t, db, "key"), "value")
	wantKVs(t, "after mutating returned slices", dump(t, db), kvs("key", "value"))
}

func testGetMany(t *testing.T, db storage.DB) {
	put(t, db, "a", "1", "b", "2", "c", "3")
	view(t, db, func(tx storage.ReadTx) error {
		vs, err := tx.GetMany([][]byte{b("c"), b("x"), b("a"), b("c"), b(""), b("b")})
		if err != nil {
			return err
		}
		want := []string{"3", "", "1", "3", "", "2"}
		absent := []bool{false, true, false, false, true, false}
		if len(vs) != len(want) {
			t.Fatalf("GetMany returned %d values for 6 keys", len(vs))
		}
		for i := range want {
			if absent[i] && vs[i] != nil || !absent[i] && string(vs[i]) != want[i] {
				t.Errorf("GetMany(c x a c '' b)[%d] = %s, want %q (absent=%v)", i, fmtValue(vs[i]), want[i], absent[i])
			}
		}
		vs, err = tx.GetMany(nil)
		if err != nil {
			return err
		}
		if len(vs) != 0 {
			t.Errorf("GetMany(nil) = %q, want no values", vs)
		}
		return nil
	})
	// GetMany reads the transaction's own writes.
	err := db.Update(testCtx(t), func(tx storage.Tx) error {
		tx.Set(b("x"), b("new"))
		tx.Clear(b("a"))
		tx.ClearRange(b("b"), b("c"))
		vs, err := tx.GetMany([][]byte{b("a"), b("b"), b("c"), b("x")})
		if err != nil {
			return err
		}
		if len(vs) != 4 || vs[0] != nil || vs[1] != nil || string(vs[2]) != "3" || string(vs[3]) != "new" {
			t.Errorf("GetMany inside Update = %q, want [nil nil 3 new]", vs)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
}

// testReadBatch: points and ranges read together give what GetMany and
// each GetRange give, in order, through the backend's Batcher or the
// fallback, in a View and inside an Update that wrote.
func testReadBatch(t *testing.T, db storage.DB) {
	put(t, db, "a", "1", "b", "2", "c", "3", "d", "4")
	ranges := []storage.RangeRead{
		{Begin: b("a"), End: b("d"), Opt: storage.RangeOptions{Limit: 1, Reverse: true}},
		{Begin: b("b"), End: b("z")},
		{Begin: b("x"), End: b("z"), Opt: storage.RangeOptions{Limit: 2}},
	}
	check := func(where string, tx storage.ReadTx, want []string, wantRanges [][]string) {
		vs, kvs, err := storage.ReadBatch(tx, [][]byte{b("d"), b("q"), b("a")}, ranges)
		if err != nil {
			t.Fatalf("%s: ReadBatch: %v", where, err)
		}
		var got []string
		for _, v := range vs {
			got = append(got, fmtValue(v))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: ReadBatch values %v, want %v", where, got, want)
		}
		var gotRanges [][]string
		for _, r := range kvs {
			var pairs []string
			for _, kv := range r {
				pairs = append(pairs, string(kv.Key)+"="+string(kv.Value))
			}
			gotRanges = append(gotRanges, pairs)
		}
		if fmt.Sprint(gotRanges) != fmt.Sprint(wantRanges) {
			t.Errorf("%s: ReadBatch ranges %v, want %v", where, gotRanges, wantRanges)
		}
	}
	view(t, db, func(tx storage.ReadTx) error {
		check("View", tx, []string{fmtValue(b("4")), fmtValue(nil), fmtValue(b("1"))},
			[][]string{{"c=3"}, {"b=2", "c=3", "d=4"}, nil})
		return nil
	})
	err := db.Update(testCtx(t), func(tx storage.Tx) error {
		tx.Clear(b("c"))
		tx.Set(b("q"), b("new"))
		tx.Set(b("y"), b("5"))
		check("Update", tx, []string{fmtValue(b("4")), fmtValue(b("new")), fmtValue(b("1"))},
			[][]string{{"b=2"}, {"b=2", "d=4", "q=new", "y=5"}, {"y=5"}})
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
}

func testGetManySorted(t *testing.T, db storage.DB) {
	// Many keys in ascending order, the shape a backend may serve with one
	// iterator: the empty key first, absent keys between present ones, an
	// empty value, and keys past the last one stored.
	put(t, db, "", "e", "a", "1", "a\x00", "", "b", "2", "d", "4", "d\x00\x00", "5", "f\xff", "6")
	state := map[string]string{"": "e", "a": "1", "a\x00": "", "b": "2", "d": "4", "d\x00\x00": "5", "f\xff": "6"}
	lists := [][]string{
		{"", "\x00", "a", "a\x00", "a\x01", "b", "c", "d", "d\x00", "d\x00\x00", "e", "f", "f\xff", "f\xff\x00", "z"},
		{"", "a", "b", "d"},
		{"\x00", "a\x00", "c", "d\x00\x00", "f\xff"},
		{"a", "a", "b", "b", "d"}, // duplicates
		{"z", "d", "b", "a", ""},  // descending
	}
	check := func(what string, tx storage.ReadTx, state map[string]string) error {
		for _, l := range lists {
			keys := make([][]byte, len(l))
			for i, k := range l {
				keys[i] = b(k)
			}
			vs, err := tx.GetMany(keys)
			if err != nil {
				return err
			}
			if len(vs) != len(keys) {
				t.Errorf("%s: GetMany of %d keys returned %d values", what, len(keys), len(vs))
				continue
			}
			for i, k := range l {
				w, ok := state[k]
				if ok && (vs[i] == nil || string(vs[i]) != w) || !ok && vs[i] != nil {
					t.Errorf("%s: GetMany(%q)[%d] (%q) = %s, want %q (present=%v)", what, l, i, k, fmtValue(vs[i]), w, ok)
				}
			}
		}
		return nil
	}
	view(t, db, func(tx storage.ReadTx) error { return check("View", tx, state) })
	err := db.Update(testCtx(t), func(tx storage.Tx) error {
		st := maps.Clone(state)
		tx.Set(b("c"), b("new"))
		st["c"] = "new"
		tx.Clear(b(""))
		delete(st, "")
		tx.ClearRange(b("d"), b("e"))
		delete(st, "d")
		delete(st, "d\x00\x00")
		tx.Set(b("d\x00"), b("back"))
		st["d\x00"] = "back"
		if err := check("Update after writes", tx, st); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
}

// testScan checks storage.Scan, the readers' one way to visit a range: the
// backend's Scanner where it has one, else GetRange, with the same visits.
func testScan(t *testing.T, db storage.DB) {
	state := map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}
	update(t, db, func(tx storage.Tx) error {
		for k, v := range state {
			tx.Set(b(k), b(v))
		}
		return nil
	})
	view(t, db, func(tx storage.ReadTx) error {
		for _, limit := range []int{0, 1, 3, 5, 10} {
			var got []storage.KeyValue
			err := storage.Scan(tx, b("a"), b("e"), limit, func(k, v []byte) bool {
				got = append(got, storage.KeyValue{Key: bytes.Clone(k), Value: bytes.Clone(v)})
				return true
			})
			if err != nil {
				return err
			}
			wantKVs(t, fmt.Sprintf("Scan(a, e, limit %d)", limit), got, model(state, b("a"), b("e"), storage.RangeOptions{Limit: limit}))
		}
		calls := 0
		err := storage.Scan(tx, all, allEnd, 4, func(k, v []byte) bool {
			calls++
			return calls < 2
		})
		if err == nil && calls != 2 {
			t.Errorf("Scan called fn %d times after it returned false on call 2", calls)
		}
		return err
	})
}

func testScanner(t *testing.T, db storage.DB) {
	state := map[string]string{"": "e", "a": "1", "a\x00": "", "b": "2", "b\xff": "3", "c": "4", "d": "5"}
	update(t, db, func(tx storage.Tx) error {
		for k, v := range state {
			tx.Set(b(k), b(v))
		}
		return nil
	})
	scanned := false
	ranges := [][2][]byte{
		{nil, allEnd}, {all, allEnd}, {b("a"), b("c")}, {b("a\x00"), b("b\xff")}, {b("b"), storage.Strinc(b("b"))},
		{b("c"), nil}, {b("c"), b("c")}, {b("d"), b("a")}, {b("z"), allEnd}, {nil, nil},
	}
	check := func(what string, tx storage.ReadTx, state map[string]string) error {
		sc, ok := tx.(storage.Scanner)
		if !ok {
			return nil
		}
		scanned = true
		for _, r := range ranges {
			var got []storage.KeyValue
			err := sc.Scan(r[0], r[1], func(k, v []byte) bool {
				got = append(got, storage.KeyValue{Key: bytes.Clone(k), Value: bytes.Clone(v)})
				return true
			})
			if err != nil {
				return err
			}
			wantKVs(t, fmt.Sprintf("%s: Scan(%q, %q)", what, r[0], r[1]), got, model(state, r[0], r[1], storage.RangeOptions{}))
		}
		// fn returning false stops the scan.
		calls := 0
		err := sc.Scan(all, allEnd, func(k, v []byte) bool {
			calls++
			return calls < 2
		})
		if err != nil {
			return err
		}
		if want := min(2, len(state)); calls != want {
			t.Errorf("%s: Scan called fn %d times after it returned false on call 2, want %d", what, calls, want)
		}
		return nil
	}
	view(t, db, func(tx storage.ReadTx) error { return check("View", tx, state) })
	if !scanned {
		t.Skip("backend's transactions do not implement storage.Scanner")
	}
	err := db.Update(testCtx(t), func(tx storage.Tx) error {
		st := maps.Clone(state)
		tx.Clear(b("a"))
		delete(st, "a")
		tx.ClearRange(b("b\x00"), b("c\x00"))
		delete(st, "b\xff")
		delete(st, "c")
		tx.Set(b("bb"), b("new"))
		st["bb"] = "new"
		if err := check("Update after writes", tx, st); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
}

func testGetRange(t *testing.T, db storage.DB) {
	state := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "b\x00", "b1", "bb"} {
		state[k] = "v-" + k
	}
	update(t, db, func(tx storage.Tx) error {
		for k, v := range state {
			tx.Set(b(k), b(v))
		}
		return nil
	})
	type rng struct {
		begin, end []byte
		opt        storage.RangeOptions
	}
	var cases []rng
	bounds := [][]byte{nil, b(""), b("a"), b("a\x00"), b("b"), b("b\x00"), b("b\x01"), b("c"), b("cc"), b("f"), b("j"), b("j\x00"), b("z"), allEnd}
	for _, lo := range bounds {
		for _, hi := range bounds {
			for _, limit := range []int{0, 1, 3, 100} {
				for _, rev := range []bool{false, true} {
					cases = append(cases, rng{lo, hi, storage.RangeOptions{Limit: limit, Reverse: rev}})
				}
			}
		}
	}
	// One transaction per lower bound keeps each one short, as callers must.
	failures := 0
	check := func(what string, tx storage.ReadTx, lo []byte) error {
		for _, c := range cases {
			if !bytes.Equal(c.begin, lo) || (c.begin == nil) != (lo == nil) {
				continue
			}
			got, err := tx.GetRange(c.begin, c.end, c.opt)
			if err != nil {
				return err
			}
			want := model(state, c.begin, c.end, c.opt)
			if !sameKVs(got, want) && failures < 10 {
				failures++
				t.Errorf("%s GetRange(%q, %q, limit=%d reverse=%v):\n got %s\nwant %s",
					what, c.begin, c.end, c.opt.Limit, c.opt.Reverse, fmtKVs(got), fmtKVs(want))
			}
		}
		return nil
	}
	for _, lo := range bounds {
		view(t, db, func(tx storage.ReadTx) error { return check("View", tx, lo) })
		// The same through a read-write transaction with no writes of its own.
		err := db.Update(testCtx(t), func(tx storage.Tx) error {
			if err := check("Update", tx, lo); err != nil {
				return err
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatalf("Update returned %v, want the function's error", err)
		}
	}
}

func testGetRangePaging(t *testing.T, db storage.DB) {
	// The usual way to scan a large range: pages of Limit keys, each page in its
	// own View, continuing after the last key seen.
	state := map[string]string{}
	update(t, db, func(tx storage.Tx) error {
		for i := range 50 {
			k := fmt.Sprintf("p/%03d", i)
			state[k] = strconv.Itoa(i)
			tx.Set(b(k), b(state[k]))
		}
		tx.Set(b("p0"), b("outside"))
		tx.Set(b("p."), b("outside"))
		return nil
	})
	begin, end := b("p/"), storage.Strinc(b("p/"))
	want := model(state, begin, end, storage.RangeOptions{})

	var fwd []storage.KeyValue
	for cur := begin; ; {
		var page []storage.KeyValue
		view(t, db, func(tx storage.ReadTx) error {
			var err error
			page, err = tx.GetRange(cur, end, storage.RangeOptions{Limit: 7})
			return err
		})
		if len(page) > 7 {
			t.Fatalf("page of %d pairs with limit 7", len(page))
		}
		fwd = append(fwd, page...)
		if len(page) < 7 {
			break
		}
		cur = append(bytes.Clone(page[len(page)-1].Key), 0)
	}
	wantKVs(t, "forward pages", fwd, want)

	var rev []storage.KeyValue
	for cur := end; ; {
		var page []storage.KeyValue
		view(t, db, func(tx storage.ReadTx) error {
			var err error
			page, err = tx.GetRange(begin, cur, storage.RangeOptions{Limit: 7, Reverse: true})
			return err
		})
		rev = append(rev, page...)
		if len(page) < 7 {
			break
		}
		cur = page[len(page)-1].Key
	}
	slices.Reverse(rev)
	wantKVs(t, "reverse pages", rev, want)
}

func testKeyOrder(t *testing.T, db storage.DB) {
	keys := []string{
		"", "\x00", "\x00\x00", "\x00\x01", "\x00\xff", "\x01",
		"a", "a\x00", "a\x00\x00", "a\x00\xff", "a\x01", "aa", "a\x7f", "a\x80", "a\xfe", "a\xff",
		"a\xff\x00", "a\xff\xff", "a\xff\xff\xff", "b", "\x7f", "\x80", "\x80\x00", "\xfe", "\xfe\xff", "\xfe\xff\xff",
	}
	state := map[string]string{}
	shuffled := slices.Clone(keys)
	rand.New(rand.NewSource(1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, k := range shuffled {
		state[k] = fmt.Sprintf("%x", k)
		put(t, db, k, state[k]) // one commit each, in random order
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, func(x, y string) int { return bytes.Compare(b(x), b(y)) })
	if !slices.Equal(sorted, keys) {
		t.Fatalf("test bug: keys not listed in byte order")
	}

	ranges := [][2][]byte{
		{all, allEnd},
		{b("a"), storage.Strinc(b("a"))},
		{b("a\xff"), storage.Strinc(b("a\xff"))},
		{b("a\x00"), b("a\xff")},
		{b("\x00"), b("\x01")},
		{b("\x00"), storage.Strinc(b("\x00"))},
		{b("\x7f"), b("\x80\x00")},
		{b("\xfe"), allEnd},
	}
	view(t, db, func(tx storage.ReadTx) error {
		for _, r := range ranges {
			for _, rev := range []bool{false, true} {
				for _, limit := range []int{0, 2} {
					opt := storage.RangeOptions{Reverse: rev, Limit: limit}
					got, err := tx.GetRange(r[0], r[1], opt)
					if err != nil {
						return err
					}
					wantKVs(t, fmt.Sprintf("GetRange(%q, %q, %+v)", r[0], r[1], opt), got, model(state, r[0], r[1], opt))
				}
			}
		}
		for _, k := range keys {
			v, err := tx.Get(b(k))
			if err != nil {
				return err
			}
			wantValue(t, fmt.Sprintf("Get(%q)", k), v, state[k])
		}
		return nil
	})
}

func testClearRange(t *testing.T, db storage.DB) {
	state := map[string]string{}
	reset := func() {
		t.Helper()
		clear(state)
		for _, k := range []string{"a", "b", "c", "c\x00", "d", "e", "f", "p", "p\x00", "p\xff", "p\xff\xff", "q"} {
			state[k] = "v" + k
		}
		update(t, db, func(tx storage.Tx) error {
			tx.ClearRange(all, allEnd)
			for k, v := range state {
				tx.Set(b(k), b(v))
			}
			return nil
		})
		wantKVs(t, "after reset", dump(t, db), model(state, all, allEnd, storage.RangeOptions{}))
	}
	cases := []struct {
		begin, end []byte
		removed    []string
	}{
		{b("c"), b("e"), []string{"c", "c\x00", "d"}},
		{b("c"), b("c"), nil},     // empty
		{b("e"), b("c"), nil},     // begin > end: empty, not an inverted clear
		{b("c"), nil, nil},        // end nil is the empty key: empty range
		{b("b\x00"), b("c"), nil}, // between keys
		{b("p"), storage.Strinc(b("p")), []string{"p", "p\x00", "p\xff", "p\xff\xff"}},
		{b("p\x00"), b("p\xff"), []string{"p\x00"}},
		{b("f"), b("f\x00"), []string{"f"}}, // exactly one key
		{nil, b("b"), []string{"a"}},
		{all, allEnd, []string{"a", "b", "c", "c\x00", "d", "e", "f", "p", "p\x00", "p\xff", "p\xff\xff", "q"}},
	}
	for _, c := range cases {
		reset()
		update(t, db, func(tx storage.Tx) error {
			tx.ClearRange(c.begin, c.end)
			return nil
		})
		for _, k := range c.removed {
			delete(state, k)
		}
		wantKVs(t, fmt.Sprintf("after ClearRange(%q, %q)", c.begin, c.end), dump(t, db), model(state, all, allEnd, storage.RangeOptions{}))
	}
}

// --- transactions --------------------------------------------------------------

func testReadYourWrites(t *testing.T, db storage.DB) {
	put(t, db, "a", "1", "b", "2", "c", "3", "d", "4", "d\x00", "4'", "e", "5")
	committed := dump(t, db)

	// Each step writes through the transaction and through a model of what
	// the transaction must then see. The model starts from what the attempt
	// first reads, so the check holds however often fn is repeated.
	type step struct {
		name string
		do   func(tx storage.Tx)
		mdl  func(m map[string]string)
	}
	clearRange := func(m map[string]string, begin, end string) {
		for k := range m {
			if k >= begin && k < end {
				delete(m, k)
			}
		}
	}
	steps := []step{
		{"Set(b)", func(tx storage.Tx) { tx.Set(b("b"), b("20")) }, func(m map[string]string) { m["b"] = "20" }},
		{"Set(x)", func(tx storage.Tx) { tx.Set(b("x"), b("new")) }, func(m map[string]string) { m["x"] = "new" }},
		{"Clear(c)", func(tx storage.Tx) { tx.Clear(b("c")) }, func(m map[string]string) { delete(m, "c") }},
		{"ClearRange(d, e)", func(tx storage.Tx) { tx.ClearRange(b("d"), b("e")) }, func(m map[string]string) { clearRange(m, "d", "e") }},
		{"Set(d\\x00)", func(tx storage.Tx) { tx.Set(b("d\x00"), b("back")) }, func(m map[string]string) { m["d\x00"] = "back" }},
		{"ClearRange(w, y)", func(tx storage.Tx) { tx.ClearRange(b("w"), b("y")) }, func(m map[string]string) { clearRange(m, "w", "y") }},
		{"Set(c)", func(tx storage.Tx) { tx.Set(b("c"), b("again")) }, func(m map[string]string) { m["c"] = "again" }},
		{"Set(e) empty", func(tx storage.Tx) { tx.Set(b("e"), nil) }, func(m map[string]string) { m["e"] = "" }},
	}
	// check reads the transaction's view in every way the interface offers.
	check := func(tx storage.Tx, after string, state map[string]string) error {
		for _, opt := range []storage.RangeOptions{{}, {Reverse: true}, {Limit: 2}, {Limit: 2, Reverse: true}} {
			got, err := tx.GetRange(all, allEnd, opt)
			if err != nil {
				return err
			}
			wantKVs(t, fmt.Sprintf("after %s: GetRange(%+v) inside the transaction", after, opt), got, model(state, all, allEnd, opt))
			got, err = tx.GetRange(b("c"), b("e\x00"), opt)
			if err != nil {
				return err
			}
			wantKVs(t, fmt.Sprintf("after %s: GetRange(c, e\\x00, %+v) inside the transaction", after, opt), got, model(state, b("c"), b("e\x00"), opt))
		}
		keys := [][]byte{b("a"), b("b"), b("c"), b("d"), b("d\x00"), b("e"), b("x")}
		vs, err := tx.GetMany(keys)
		if err != nil {
			return err
		}
		if len(vs) != len(keys) {
			t.Errorf("after %s: GetMany of %d keys returned %d values", after, len(keys), len(vs))
			vs = make([][]byte, len(keys))
		}
		for j, k := range keys {
			v, err := tx.Get(k)
			if err != nil {
				return err
			}
			w, ok := state[string(k)]
			if ok && (string(v) != w || v == nil) || !ok && v != nil {
				t.Errorf("after %s: Get(%q) = %s inside the transaction, want %q (present=%v)", after, k, fmtValue(v), w, ok)
			}
			if ok && (string(vs[j]) != w || vs[j] == nil) || !ok && vs[j] != nil {
				t.Errorf("after %s: GetMany[%q] = %s inside the transaction, want %q (present=%v)", after, k, fmtValue(vs[j]), w, ok)
			}
		}
		return nil
	}
	run := func(commit bool) (final map[string]string, err error) {
		err = db.Update(testCtx(t), func(tx storage.Tx) error {
			start, err := tx.GetRange(all, allEnd, storage.RangeOptions{})
			if err != nil {
				return err
			}
			state := map[string]string{}
			for _, kv := range start {
				state[string(kv.Key)] = string(kv.Value)
			}
			for _, s := range steps {
				s.do(tx)
				s.mdl(state)
				if err := check(tx, s.name, state); err != nil {
					return err
				}
			}
			final = state
			if !commit {
				return errRollback
			}
			return nil
		})
		return final, err
	}
	if _, err := run(false); !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
	wantKVs(t, "committed state after a rolled-back transaction", dump(t, db), committed)
	final, err := run(true)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	wantKVs(t, "committed state", dump(t, db), model(final, all, allEnd, storage.RangeOptions{}))
	wantKVs(t, "committed state", dump(t, db), kvs("a", "1", "b", "20", "c", "again", "d\x00", "back", "e", ""))
}

func testRollback(t *testing.T, db storage.DB) {
	put(t, db, "a", "1", "b", "2", "c", "3", "c1", "4")
	before := dump(t, db)
	errBoom := errors.New("boom")
	calls := 0
	err := db.Update(testCtx(t), func(tx storage.Tx) error {
		tx.Set(b("a"), b("100"))
		tx.Set(b("new"), b("x"))
		tx.Clear(b("b"))
		tx.ClearRange(b("c"), b("d"))
		v, err := tx.Get(b("a"))
		if err != nil {
			return err // retryable read errors are retried
		}
		calls++
		return fmt.Errorf("after reading %q: %w", v, errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Update returned %v, want the function's error (wrapped)", err)
	}
	if calls != 1 {
		t.Errorf("fn ran %d times for a non-retryable error, want 1", calls)
	}
	wantKVs(t, "state after a failed Update", dump(t, db), before)

	// Nothing stays locked or half-applied: the next transaction works.
	put(t, db, "a", "after")
	wantValue(t, "Get(a)", get(t, db, "a"), "after")

	errView := errors.New("view failed")
	calls = 0
	err = db.View(testCtx(t), func(tx storage.ReadTx) error {
		calls++
		return errView
	})
	if !errors.Is(err, errView) || calls != 1 {
		t.Errorf("View returned %v after %d calls, want the function's error after 1", err, calls)
	}
}

func testRetryableErrorFromFn(t *testing.T, db storage.DB) {
	// fn returns a retryable error twice; Update runs it again each time, the
	// failed attempts' writes are discarded, and the marker keeps the effect
	// single however often the last attempt is repeated.
	attempts := 0
	update(t, db, func(tx storage.Tx) error {
		attempts++
		switch attempts {
		case 1:
			tx.Set(b("leak"), b("from attempt 1"))
			tx.Set(b("count"), b("100"))
			return fmt.Errorf("read failed: %w", storage.ErrTransactionTooOld)
		case 2:
			tx.Set(b("leak"), b("from attempt 2"))
			return storage.ErrNotCommitted
		}
		done, err := tx.Get(b("marker"))
		if err != nil || done != nil {
			return err
		}
		n, err := readInt(tx, "count")
		if err != nil {
			return err
		}
		tx.Set(b("count"), b(strconv.Itoa(n+1)))
		tx.Set(b("marker"), b("1"))
		return nil
	})
	if attempts < 3 {
		t.Errorf("fn ran %d times, want at least 3 (two retryable errors)", attempts)
	}
	wantAbsent(t, "Get(leak) written only by failed attempts", get(t, db, "leak"))
	wantValue(t, "Get(count)", get(t, db, "count"), "1")
}

func readInt(tx storage.ReadTx, key string) (int, error) {
	v, err := tx.Get(b(key))
	if err != nil || v == nil {
		return 0, err
	}
	return strconv.Atoi(string(v))
}

// incr adds one to counter exactly once per id, however often it is run.
func incr(ctx context.Context, db storage.DB, counter, id string) error {
	return db.Update(ctx, func(tx storage.Tx) error {
		marker := b("marker/" + counter + "/" + id)
		done, err := tx.Get(marker)
		if err != nil || done != nil {
			return err
		}
		n, err := readInt(tx, counter)
		if err != nil {
			return err
		}
		tx.Set(b(counter), b(strconv.Itoa(n+1)))
		tx.Set(marker, []byte{})
		return nil
	})
}

func testIdempotentRepeats(t *testing.T, db storage.DB) {
	// A caller that is unsure whether its Update landed runs it again; with a
	// marker the effect appears once.
	ctx := testCtx(t)
	for round := range 3 {
		for i := range 10 {
			if err := incr(ctx, db, "n", strconv.Itoa(i)); err != nil {
				t.Fatalf("round %d: incr: %v", round, err)
			}
		}
		wantValue(t, fmt.Sprintf("counter after round %d", round), get(t, db, "n"), "10")
	}
}

func testViewRetries(t *testing.T, db storage.DB) {
	put(t, db, "k", "v")
	attempts := 0
	var got []byte
	view(t, db, func(tx storage.ReadTx) error {
		attempts++
		if attempts == 1 {
			return fmt.Errorf("first attempt: %w", storage.ErrTransactionTooOld)
		}
		var err error
		got, err = tx.Get(b("k"))
		return err
	})
	if attempts < 2 {
		t.Errorf("View ran fn %d times after a retryable error, want at least 2", attempts)
	}
	wantValue(t, "Get(k) in the retried View", got, "v")
}

func testRetryEndsWithContext(t *testing.T, db storage.DB) {
	// A function that always fails retryably is retried until ctx ends, and
	// not forever.
	for _, retryable := range []error{storage.ErrTransactionTooOld, storage.ErrNotCommitted} {
		var attempts atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := returnsWithin(t, 10*time.Second, "Update that always fails retryably", func() error {
			return db.Update(ctx, func(tx storage.Tx) error {
				attempts.Add(1)
				tx.Set(b("k"), b("v"))
				return retryable
			})
		})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Update always failing with %v returned %v, want context.DeadlineExceeded", retryable, err)
		}
		if attempts.Load() < 2 {
			t.Errorf("Update always failing with %v ran fn %d times, want retries", retryable, attempts.Load())
		}
		ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = returnsWithin(t, 10*time.Second, "View that always fails retryably", func() error {
			return db.View(ctx, func(tx storage.ReadTx) error { return retryable })
		})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("View always failing with %v returned %v, want context.DeadlineExceeded", retryable, err)
		}
	}
	wantAbsent(t, "Get(k) never committed", get(t, db, "k"))
}

func testCanceledContext(t *testing.T, db storage.DB) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := db.Update(ctx, func(tx storage.Tx) error {
		tx.Set(b("k"), b("v"))
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a canceled context returned %v, want context.Canceled", err)
	}
	err = db.View(ctx, func(tx storage.ReadTx) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("View with a canceled context returned %v, want context.Canceled", err)
	}
}

// --- isolation -----------------------------------------------------------------

func testViewSnapshot(t *testing.T, db storage.DB) {
	put(t, db, "a", "old", "b", "old")
	type attempt struct {
		ranUpdate bool
		values    []string
	}
	var attempts []attempt
	updated := false
	view(t, db, func(tx storage.ReadTx) error {
		cur := attempt{}
		v, err := tx.Get(b("a")) // the first read fixes the snapshot
		if err != nil {
			return err
		}
		cur.values = append(cur.values, string(v))
		if !updated {
			// Commit a change while this View is open (from another goroutine,
			// as another client would) and wait for it.
			updated, cur.ranUpdate = true, true
			err := returnsWithin(t, opTimeout, "Update inside a View", func() error {
				return db.Update(context.Background(), func(tx storage.Tx) error {
					tx.Set(b("a"), b("new"))
					tx.Set(b("b"), b("new"))
					tx.Set(b("c"), b("new"))
					return nil
				})
			})
			if err != nil {
				return fmt.Errorf("concurrent Update: %w", err)
			}
		}
		for _, k := range []string{"a", "b", "c"} {
			v, err := tx.Get(b(k))
			if err != nil {
				return err
			}
			if v == nil {
				cur.values = append(cur.values, "<absent>")
			} else {
				cur.values = append(cur.values, string(v))
			}
		}
		vs, err := tx.GetMany([][]byte{b("a"), b("b")})
		if err != nil {
			return err
		}
		for _, v := range vs {
			cur.values = append(cur.values, string(v))
		}
		kvs, err := tx.GetRange(all, allEnd, storage.RangeOptions{})
		if err != nil {
			return err
		}
		cur.values = append(cur.values, fmtKVs(kvs))
		attempts = append(attempts, cur)
		return nil
	})
	// Only attempts that saw all their reads through are recorded; the last
	// one is the View's answer.
	if len(attempts) == 0 {
		t.Fatalf("View returned without a successful attempt")
	}
	a := attempts[len(attempts)-1]
	old := []string{"old", "old", "old", "<absent>", "old", "old", fmtKVs(kvs("a", "old", "b", "old"))}
	nu := []string{"new", "new", "new", "new", "new", "new", fmtKVs(kvs("a", "new", "b", "new", "c", "new"))}
	switch {
	case a.ranUpdate && !slices.Equal(a.values, old):
		t.Errorf("View saw an Update that committed after its first read:\n got %q\nwant %q", a.values, old)
	case !a.ranUpdate && !slices.Equal(a.values, nu):
		// A retried attempt starts after the Update: it must see all of it.
		t.Errorf("View (retried after the Update) reads:\n got %q\nwant %q", a.values, nu)
	}
	wantValue(t, "Get(c) after the View", get(t, db, "c"), "new")
}

func testViewConsistentUnderWrites(t *testing.T, db storage.DB) {
	// Writers keep a, b and c equal; readers must never see them differ.
	ctx := testCtx(t)
	put(t, db, "a", "0", "b", "0", "c", "0")
	const writers, readers, writes = 2, 2, 150
	// The writers start once a reader runs: on a loaded machine they could
	// otherwise finish before any reader was scheduled.
	reading := make(chan struct{})
	var readingOnce sync.Once
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		reads   atomic.Int64
		mu      sync.Mutex
		errs    []string
		failErr = func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			if len(errs) < 10 {
				errs = append(errs, fmt.Sprintf(format, args...))
			}
		}
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-reading
			for i := range writes {
				v := b(fmt.Sprintf("w%d-%d", w, i))
				err := db.Update(ctx, func(tx storage.Tx) error {
					tx.Set(b("a"), v)
					runtime.Gosched()
					tx.Set(b("b"), v)
					tx.Set(b("c"), v)
					return nil
				})
				if err != nil {
					failErr("writer Update: %v", err)
					return
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			readingOnce.Do(func() { close(reading) })
			for !stop.Load() {
				err := db.View(ctx, func(tx storage.ReadTx) error {
					a, err := tx.Get(b("a"))
					if err != nil {
						return err
					}
					runtime.Gosched()
					bv, err := tx.Get(b("b"))
					if err != nil {
						return err
					}
					runtime.Gosched()
					vs, err := tx.GetMany([][]byte{b("c"), b("a")})
					if err != nil {
						return err
					}
					kvs, err := tx.GetRange(b("a"), b("d"), storage.RangeOptions{})
					if err != nil {
						return err
					}
					if !bytes.Equal(a, bv) || len(vs) != 2 || !bytes.Equal(a, vs[0]) || !bytes.Equal(a, vs[1]) ||
						!sameKVs(kvs, []storage.KeyValue{{Key: b("a"), Value: a}, {Key: b("b"), Value: a}, {Key: b("c"), Value: a}}) {
						failErr("one View read a=%q, then b=%q, GetMany(c, a)=%q, GetRange=%s", a, bv, vs, fmtKVs(kvs))
					}
					reads.Add(1)
					return nil
				})
				if err != nil {
					failErr("reader View: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	rwg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	if reads.Load() == 0 {
		t.Errorf("no View completed while the writers ran")
	}
}

func testSerializableCounter(t *testing.T, db storage.DB) {
	// Concurrent read-modify-write transactions: no increment is lost. (The
	// marker makes each increment idempotent, so it also holds when commits
	// are reported unknown and repeated.)
	ctx := testCtx(t)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := incr(ctx, db, "counter", fmt.Sprintf("%d-%d", w, i)); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("incr: %v", err)
	}
	wantValue(t, "counter", get(t, db, "counter"), strconv.Itoa(workers*each))
}

func testWriteSkew(t *testing.T, db storage.DB) {
	// Each transaction claims a slot only when no slot is claimed. Under
	// snapshot isolation both can claim (write skew); serializable
	// transactions leave exactly one claim.
	ctx := testCtx(t)
	const rounds = 30
	for round := range rounds {
		x, y := b(fmt.Sprintf("skew/%02d/x", round)), b(fmt.Sprintf("skew/%02d/y", round))
		var wg, ready sync.WaitGroup
		start := make(chan struct{})
		errc := make(chan error, 2)
		for _, mine := range [][]byte{x, y} {
			wg.Add(1)
			ready.Add(1)
			go func() {
				defer wg.Done()
				ready.Done()
				<-start
				errc <- db.Update(ctx, func(tx storage.Tx) error {
					vs, err := tx.GetMany([][]byte{x, y})
					if err != nil {
						return err
					}
					time.Sleep(200 * time.Microsecond) // let the other one read too
					if vs[0] == nil && vs[1] == nil {
						tx.Set(mine, b("claimed"))
					}
					return nil
				})
			}()
		}
		ready.Wait()
		close(start)
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				t.Fatalf("round %d: Update: %v", round, err)
			}
		}
		var claims []storage.KeyValue
		view(t, db, func(tx storage.ReadTx) error {
			var err error
			claims, err = tx.GetRange(b(fmt.Sprintf("skew/%02d/", round)), b(fmt.Sprintf("skew/%02d0", round)), storage.RangeOptions{})
			return err
		})
		if len(claims) != 1 {
			t.Fatalf("round %d: %d slots claimed %s, want exactly 1 (transactions not serializable)", round, len(claims), fmtKVs(claims))
		}
	}
}

// --- limits ------------------------------------------------------------------

func bigKey(prefix string, n int, fill byte) []byte {
	k := bytes.Repeat([]byte{fill}, n)
	copy(k, prefix)
	return k
}

func bigValue(seed, n int) []byte {
	v := make([]byte, n)
	rand.New(rand.NewSource(int64(seed))).Read(v)
	return v
}

func testMaxSizes(t *testing.T, db storage.DB) {
	k1 := bigKey("k1", storage.MaxKeySize, 'x')
	k2 := bigKey("k2", storage.MaxKeySize, 0xff)
	k3 := bigKey("k3", storage.MaxKeySize, 0x00)
	v1 := bigValue(1, storage.MaxValueSize)
	v2 := bigValue(2, storage.MaxValueSize)
	update(t, db, func(tx storage.Tx) error {
		tx.Set(k1, v1)
		tx.Set(k2, v2)
		tx.Set(k3, []byte("small"))
		v, err := tx.Get(k1)
		if err != nil {
			return err
		}
		if !bytes.Equal(v, v1) {
			t.Errorf("Get of a max-size key inside its transaction returned %d bytes, want the %d written", len(v), len(v1))
		}
		return nil
	})
	view(t, db, func(tx storage.ReadTx) error {
		vs, err := tx.GetMany([][]byte{k1, k2, k3})
		if err != nil {
			return err
		}
		if len(vs) != 3 || !bytes.Equal(vs[0], v1) || !bytes.Equal(vs[1], v2) || string(vs[2]) != "small" {
			t.Errorf("GetMany of max-size keys did not return the max-size values")
		}
		got, err := tx.GetRange(k1, storage.Strinc(b("k3")), storage.RangeOptions{})
		if err != nil {
			return err
		}
		want := []storage.KeyValue{{Key: k1, Value: v1}, {Key: k2, Value: v2}, {Key: k3, Value: b("small")}}
		wantKVs(t, "GetRange over max-size keys", got, want)
		got, err = tx.GetRange(k2, k3, storage.RangeOptions{})
		if err != nil {
			return err
		}
		wantKVs(t, "GetRange(k2, k3) over max-size keys", got, want[1:2])
		return nil
	})
	update(t, db, func(tx storage.Tx) error {
		tx.Clear(k1)
		tx.ClearRange(k3, storage.Strinc(b("k3")))
		return nil
	})
	wantKVs(t, "after clearing max-size keys", dump(t, db), []storage.KeyValue{{Key: k2, Value: v2}})
}

func testLargeTransaction(t *testing.T, db storage.DB) {
	// Just under MaxTransactionBytes in one transaction must commit.
	const n = storage.MaxTransactionBytes/(storage.MaxValueSize+100) - 1
	want := make([]storage.KeyValue, n)
	for i := range want {
		want[i] = storage.KeyValue{Key: b(fmt.Sprintf("big/%03d", i)), Value: bigValue(i, storage.MaxValueSize)}
	}
	update(t, db, func(tx storage.Tx) error {
		for _, kv := range want {
			tx.Set(kv.Key, kv.Value)
		}
		return nil
	})
	got := dump(t, db)
	if !sameKVs(got, want) {
		t.Errorf("after writing %d values of %d bytes in one transaction, read back %d pairs that differ", n, storage.MaxValueSize, len(got))
	}
	update(t, db, func(tx storage.Tx) error {
		tx.ClearRange(b("big/"), storage.Strinc(b("big/")))
		return nil
	})
	wantKVs(t, "after clearing", dump(t, db), nil)
}

// --- WaitChange ----------------------------------------------------------------

func testWaitChangeImmediate(t *testing.T, db storage.DB) {
	put(t, db, "k", "v1", "empty", "")
	cases := []struct {
		key  string
		seen []byte
	}{
		{"k", b("v0")},       // present, differs
		{"k", nil},           // present, seen absent
		{"k", []byte{}},      // present, seen empty
		{"absent", b("v")},   // absent, seen present
		{"absent", []byte{}}, // absent, seen empty: empty is not absent
		{"empty", nil},       // empty value, seen absent
		{"empty", b("x")},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := returnsWithin(t, 10*time.Second, "WaitChange on a value that already differs", func() error {
			return db.WaitChange(ctx, b(c.key), c.seen)
		})
		cancel()
		if err != nil {
			t.Errorf("WaitChange(%q, seen=%s) = %v, want nil at once (the value differs)", c.key, fmtValue(c.seen), err)
		}
	}
}

// waitAsync starts WaitChange and returns its result channel.
func waitAsync(ctx context.Context, db storage.DB, key string, seen []byte) <-chan error {
	done := make(chan error, 1)
	go func() { done <- db.WaitChange(ctx, b(key), seen) }()
	return done
}

func mustBlock(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) although nothing was committed", what, err)
	case <-time.After(quiet):
	}
}

func mustReturn(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s returned %v, want nil", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return after a commit changed the value", what)
	}
}

// testRecentViewMonotonic: a Recent View reads every commit the DB has
// made, and nothing older than what a View of the DB has already read.
func testRecentViewMonotonic(t *testing.T, db storage.DB) {
	recent := storage.WithFreshness(testCtx(t), storage.Recent)
	if storage.FreshnessOf(testCtx(t)) != storage.Latest || storage.FreshnessOf(recent) != storage.Recent {
		t.Fatal("FreshnessOf does not return what WithFreshness set, or Latest by default")
	}
	for i := range 20 {
		want := fmt.Sprint(i)
		update(t, db, func(tx storage.Tx) error {
			tx.Set(b("n"), b(want))
			return nil
		})
		for _, ctx := range []context.Context{recent, testCtx(t), recent} {
			var got []byte
			if err := db.View(ctx, func(tx storage.ReadTx) error {
				var err error
				got, err = tx.Get(b("n"))
				return err
			}); err != nil {
				t.Fatalf("View: %v", err)
			}
			if string(got) != want {
				t.Fatalf("View (%v) after commit %s read %q", storage.FreshnessOf(ctx), want, got)
			}
		}
	}
}

func testWaitChangeBlocks(t *testing.T, db storage.DB) {
	ctx := testCtx(t)
	put(t, db, "k", "v1")

	done := waitAsync(ctx, db, "k", b("v1"))
	mustBlock(t, done, "WaitChange(k, v1)")
	put(t, db, "k", "v2")
	mustReturn(t, done, "WaitChange(k, v1)")

	// Several waiters all wake on one commit; a Clear is a change.
	var waiters []<-chan error
	for range 4 {
		waiters = append(waiters, waitAsync(ctx, db, "k", b("v2")))
	}
	for _, w := range waiters {
		mustBlock(t, w, "WaitChange(k, v2)")
	}
	update(t, db, func(tx storage.Tx) error { tx.Clear(b("k")); return nil })
	for _, w := range waiters {
		mustReturn(t, w, "WaitChange(k, v2) woken by Clear")
	}

	// An empty value is a change from absent.
	done = waitAsync(ctx, db, "k", nil)
	mustBlock(t, done, "WaitChange(k, nil) on an absent key")
	put(t, db, "k", "")
	mustReturn(t, done, "WaitChange(k, nil) woken by setting an empty value")
}

func testWaitChangeAbsent(t *testing.T, db storage.DB) {
	ctx := testCtx(t)
	done := waitAsync(ctx, db, "new", nil)
	mustBlock(t, done, "WaitChange(new, nil) on an absent key")
	// A commit from another goroutine that creates the key wakes the waiter.
	writerDone := make(chan error, 1)
	go func() {
		writerDone <- db.Update(ctx, func(tx storage.Tx) error {
			tx.Set(b("new"), b("here"))
			return nil
		})
	}()
	mustReturn(t, done, "WaitChange(new, nil)")
	if err := <-writerDone; err != nil {
		t.Fatalf("writer Update: %v", err)
	}
	wantValue(t, "Get(new)", get(t, db, "new"), "here")
}

func testWaitChangeContext(t *testing.T, db storage.DB) {
	put(t, db, "k", "v")

	ctx, cancel := context.WithCancel(context.Background())
	done := waitAsync(ctx, db, "k", b("v"))
	mustBlock(t, done, "WaitChange(k, v)")
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("WaitChange after cancel returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("WaitChange did not return after its context was canceled")
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel()
	err := returnsWithin(t, 10*time.Second, "WaitChange with a deadline", func() error {
		return db.WaitChange(dctx, b("k"), b("v"))
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitChange past its deadline returned %v, want context.DeadlineExceeded", err)
	}

	// An absent key waited on as absent blocks too, until ctx ends.
	dctx2, dcancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer dcancel2()
	err = returnsWithin(t, 10*time.Second, "WaitChange(absent, nil) with a deadline", func() error {
		return db.WaitChange(dctx2, b("absent"), nil)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitChange(absent, nil) past its deadline returned %v, want context.DeadlineExceeded", err)
	}
}

func testWaitChangeLoop(t *testing.T, db storage.DB) {
	// The caller's loop: wait, re-read, wait again until the value is the one
	// wanted. Commits to other keys may wake it spuriously; it must still end.
	ctx := testCtx(t)
	put(t, db, "k", "0")
	errc := make(chan error, 1)
	go func() {
		for i := range 20 {
			err := db.Update(ctx, func(tx storage.Tx) error {
				tx.Set(b(fmt.Sprintf("other/%d", i)), b("x"))
				if i%5 == 4 {
					tx.Set(b("k"), b(strconv.Itoa(i/5+1)))
				}
				return nil
			})
			if err != nil {
				errc <- err
				return
			}
			time.Sleep(time.Millisecond)
		}
		errc <- nil
	}()
	var seen []byte
	wakeups := 0
	for string(seen) != "4" {
		var v []byte
		view(t, db, func(tx storage.ReadTx) error {
			var err error
			v, err = tx.Get(b("k"))
			return err
		})
		seen = v
		if string(seen) == "4" {
			break
		}
		if err := db.WaitChange(ctx, b("k"), seen); err != nil {
			t.Fatalf("WaitChange: %v", err)
		}
		wakeups++
	}
	if err := <-errc; err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("%d wake-ups for 4 changes among 20 commits", wakeups)
}

// testWaitChangeOwnCommit: a commit wakes the WaitChange calls of the
// same DB on the keys it wrote by the time its Update returns, so such a
// call returns nil even when its context ends right after. (On
// FoundationDB a watch fires only once a storage server has applied the
// commit, milliseconds later; a write owner's watch hub waits on a key
// its own commits write.) Sets, Clears and ClearRanges all wake.
func testWaitChangeOwnCommit(t *testing.T, db storage.DB) {
	writes := []struct {
		what  string
		write func(tx storage.Tx)
		after []byte
	}{
		{"Set", func(tx storage.Tx) { tx.Set(b("k"), b("1")) }, b("1")},
		{"Clear", func(tx storage.Tx) { tx.Clear(b("k")) }, nil},
		{"Set of an absent key", func(tx storage.Tx) { tx.Set(b("k"), b("2")) }, b("2")},
		{"ClearRange", func(tx storage.Tx) { tx.ClearRange(b("j"), b("l")) }, nil},
		{"Set to empty", func(tx storage.Tx) { tx.Set(b("k"), []byte{}) }, []byte{}},
		{"Set among others", func(tx storage.Tx) {
			tx.Set(b("a"), b("x"))
			tx.Set(b("k"), b("3"))
			tx.Set(b("z"), b("x"))
		}, b("3")},
	}
	var seen []byte // k is absent
	for _, w := range writes {
		ctx, cancel := context.WithCancel(testCtx(t))
		done := waitAsync(ctx, db, "k", seen)
		mustBlock(t, done, "WaitChange(k) before "+w.what)
		update(t, db, func(tx storage.Tx) error { w.write(tx); return nil })
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("WaitChange(k) canceled right after the %s of k returned: %v, want nil (the commit wakes it before Update returns)", w.what, err)
		}
		seen = w.after
	}
}

// --- Close ---------------------------------------------------------------------

func testClosed(t *testing.T, db storage.DB) {
	put(t, db, "k", "v")
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := testCtx(t)
	ran := false
	err := db.Update(ctx, func(tx storage.Tx) error { ran = true; return nil })
	if !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Update after Close = %v, want storage.ErrClosed", err)
	}
	err = db.View(ctx, func(tx storage.ReadTx) error { ran = true; return nil })
	if !errors.Is(err, storage.ErrClosed) {
		t.Errorf("View after Close = %v, want storage.ErrClosed", err)
	}
	if ran {
		t.Errorf("a transaction function ran after Close")
	}
	for _, seen := range [][]byte{b("v"), b("other"), nil} {
		err := returnsWithin(t, 10*time.Second, "WaitChange after Close", func() error {
			return db.WaitChange(ctx, b("k"), seen)
		})
		if !errors.Is(err, storage.ErrClosed) {
			t.Errorf("WaitChange(k, %s) after Close = %v, want storage.ErrClosed", fmtValue(seen), err)
		}
	}
	if s, ok := db.(storage.Sizer); ok {
		if _, err := s.Size(); !errors.Is(err, storage.ErrClosed) {
			t.Errorf("Size after Close = %v, want storage.ErrClosed", err)
		}
	}
	if err := db.Close(); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("second Close = %v, want storage.ErrClosed", err)
	}
}

func testCloseWakesWaiters(t *testing.T, db storage.DB) {
	put(t, db, "k", "v")
	done := waitAsync(context.Background(), db, "k", b("v"))
	absent := waitAsync(context.Background(), db, "absent", nil)
	mustBlock(t, done, "WaitChange(k, v)")
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, c := range []<-chan error{done, absent} {
		select {
		case err := <-c:
			if !errors.Is(err, storage.ErrClosed) {
				t.Errorf("WaitChange blocked across Close returned %v, want storage.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("WaitChange without a deadline did not return after Close")
		}
	}
}

func testCloseWhileBusy(t *testing.T, db storage.DB) {
	// Close while transactions and waiters are running: every call returns nil
	// or ErrClosed (never panics, never hangs), and the calls after it fail.
	put(t, db, "k", "0")
	ctx := testCtx(t)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		bad      []string
		progress atomic.Int64
	)
	report := func(what string, err error) bool {
		if err == nil {
			progress.Add(1)
			return true
		}
		if !errors.Is(err, storage.ErrClosed) {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%s: %v", what, err))
			mu.Unlock()
		}
		return false
	}
	loop := func(what string, f func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; report(what, f(i)); i++ {
			}
		}()
	}
	loop("Update", func(i int) error {
		return db.Update(ctx, func(tx storage.Tx) error {
			if _, err := tx.Get(b("k")); err != nil {
				return err
			}
			tx.Set(b("k"), b(strconv.Itoa(i)))
			return nil
		})
	})
	loop("View", func(int) error {
		return db.View(ctx, func(tx storage.ReadTx) error {
			_, err := tx.GetRange(all, allEnd, storage.RangeOptions{})
			return err
		})
	})
	loop("WaitChange", func(int) error {
		return db.WaitChange(ctx, b("k"), b("no such value"))
	})
	loop("WaitChange(absent)", func(int) error {
		return db.WaitChange(ctx, b("absent"), nil) // blocks until Close
	})
	deadline := time.Now().Add(5 * time.Second)
	for progress.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := returnsWithin(t, opTimeout, "Close while busy", db.Close); err != nil {
		t.Errorf("Close: %v", err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(opTimeout):
		t.Fatalf("calls did not end after Close")
	}
	for _, s := range bad {
		t.Errorf("call around Close failed with something other than ErrClosed: %s", s)
	}
	if progress.Load() == 0 {
		t.Errorf("no call succeeded before Close")
	}
}

func testSizer(t *testing.T, db storage.DB) {
	s, ok := db.(storage.Sizer)
	if !ok {
		t.Skip("backend does not implement storage.Sizer")
	}
	put(t, db, "k", string(bigValue(1, 10_000)))
	n, err := s.Size()
	// etcd reports a non-empty member's dbSize as positive; clients and
	// dashboards read 0 as an empty or broken member.
	if err != nil || n <= 0 {
		t.Errorf("Size() = %d, %v, want a positive size after a 10 kB write", n, err)
	}
}

// --- Strinc --------------------------------------------------------------------

func testStrinc(t *testing.T, _ storage.DB) {
	cases := []struct{ in, want string }{
		{"a", "b"},
		{"ab", "ac"},
		{"a\xff", "b"},
		{"a\xff\xff", "b"},
		{"\x00", "\x01"},
		{"\x00\xff", "\x01"},
		{"a\x00", "a\x01"},
		{"\xfe\xff", "\xff"},
		{"foo/", "foo0"},
	}
	for _, c := range cases {
		in := b(c.in)
		got := storage.Strinc(in)
		if string(got) != c.want {
			t.Errorf("Strinc(%q) = %q, want %q", c.in, got, c.want)
		}
		if string(in) != c.in {
			t.Errorf("Strinc(%q) modified its argument to %q", c.in, in)
		}
		if len(got) > 0 && len(in) > 0 {
			got[0] ^= 0xff
			if string(in) != c.in {
				t.Errorf("Strinc(%q) returned a slice sharing memory with its argument", c.in)
			}
		}
	}
	for _, in := range []string{"", "\xff", "\xff\xff\xff"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Strinc(%q) did not panic: no key ends that prefix range", in)
				}
			}()
			storage.Strinc(b(in))
		}()
	}
	// Strinc(p) bounds exactly the keys prefixed by p.
	for _, p := range []string{"a", "a\xff", "\x00", "ab\xff"} {
		end := storage.Strinc(b(p))
		for _, k := range []string{p, p + "\x00", p + "\xff", p + "\xff\xff\xff", p + "zzz"} {
			if bytes.Compare(b(k), end) >= 0 {
				t.Errorf("%q, which has prefix %q, is not below Strinc = %q", k, p, end)
			}
		}
		if bytes.Compare(end, b(p)) <= 0 {
			t.Errorf("Strinc(%q) = %q is not above the prefix", p, end)
		}
		if bytes.HasPrefix(end, b(p)) {
			t.Errorf("Strinc(%q) = %q itself has the prefix", p, end)
		}
	}
}

// testSnapshotter: Views that name the same snapshot read the same data,
// concurrent with commits, Latest and Recent alike; a Latest View after a
// commit names a newer snapshot than one before it; an Update names none.
func testSnapshotter(t *testing.T, db storage.DB) {
	k := b("snapshot")
	update(t, db, func(tx storage.Tx) error {
		if s := storage.SnapshotOf(tx); s != 0 {
			t.Errorf("an Update's transaction names snapshot %d", s)
		}
		tx.Set(k, b("0"))
		return nil
	})
	read := func(ctx context.Context) (snap int64, val string) {
		err := db.View(ctx, func(tx storage.ReadTx) error {
			v, err := tx.Get(k)
			snap, val = storage.SnapshotOf(tx), string(v)
			return err
		})
		if err != nil {
			t.Errorf("View: %v", err) // Errorf: the readers below run on goroutines of their own
			return -1, ""
		}
		return snap, val
	}
	before, _ := read(testCtx(t))
	if before == 0 {
		t.Skip("backend's Views do not implement storage.Snapshotter")
	}
	update(t, db, func(tx storage.Tx) error { tx.Set(k, b("1")); return nil })
	if after, v := read(testCtx(t)); after <= before || v != "1" {
		t.Errorf("a View after a commit: snapshot %d reading %q, want above %d reading \"1\"", after, v, before)
	}
	var (
		views atomic.Int64
		mu    sync.Mutex
		seen  = map[int64]string{}
		wg    sync.WaitGroup
		stop  = make(chan struct{})
		fresh = []storage.Freshness{storage.Latest, storage.Recent}
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := storage.WithFreshness(testCtx(t), fresh[g%2])
			for {
				select {
				case <-stop:
					return
				default:
				}
				snap, v := read(ctx)
				if snap < 0 {
					return
				}
				views.Add(1)
				mu.Lock()
				if prev, ok := seen[snap]; ok && prev != v {
					t.Errorf("two Views of snapshot %d read %q and %q", snap, prev, v)
				}
				seen[snap] = v
				mu.Unlock()
			}
		}()
	}
	for i := 2; i < 100; i++ {
		update(t, db, func(tx storage.Tx) error { tx.Set(k, b(fmt.Sprint(i))); return nil })
		// Let Views read between the commits, however fast they are.
		for n, deadline := views.Load(), time.Now().Add(5*time.Second); views.Load() < n+2 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	}
	close(stop)
	wg.Wait()
	if len(seen) < 2 {
		t.Errorf("Views under 98 commits named %d snapshots", len(seen))
	}
}
