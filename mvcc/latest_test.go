package mvcc

import (
	"bytes"
	"fmt"
	"testing"
)

// TestLatestValuesServeOnlyTheRevisionThatWrote: a value is known for the
// revision that put it and no other, a delete forgets it, and a newer put
// replaces it.
func TestLatestValuesServeOnlyTheRevisionThatWrote(t *testing.T) {
	l := newLatestValues(1 << 20)
	l.put([]byte("k"), 5, []byte("v5"))
	if v, ok := l.get([]byte("k"), 5); !ok || string(v) != "v5" {
		t.Fatalf("get(k, 5) = %q, %v; want v5", v, ok)
	}
	for _, rev := range []int64{4, 6} {
		if v, ok := l.get([]byte("k"), rev); ok {
			t.Fatalf("get(k, %d) = %q; revision 5 wrote the value held", rev, v)
		}
	}
	l.put([]byte("k"), 9, []byte("v9"))
	if _, ok := l.get([]byte("k"), 5); ok {
		t.Fatal("get(k, 5) after revision 9 put k: served a replaced value")
	}
	if v, ok := l.get([]byte("k"), 9); !ok || string(v) != "v9" {
		t.Fatalf("get(k, 9) = %q, %v; want v9", v, ok)
	}
	l.forget([]byte("k"))
	if _, ok := l.get([]byte("k"), 9); ok {
		t.Fatal("get(k, 9) after a delete: served a forgotten value")
	}
	if l.size != len(l.order)*latestOrderOverhead+2*len("k") {
		t.Fatalf("size %d after a delete; only the two order records remain", l.size)
	}
}

// TestLatestValuesStayWithinTheirBound: many keys, and one key rewritten
// over and over, never take the values past their bound, and the newest
// writes are the ones kept.
func TestLatestValuesStayWithinTheirBound(t *testing.T) {
	const bound = 64 << 10
	l := newLatestValues(bound)
	value := bytes.Repeat([]byte("x"), 500)
	for rev := int64(1); rev <= 10_000; rev++ {
		key := fmt.Appendf(nil, "key-%d", rev%300)
		if rev%2 == 0 {
			key = []byte("hot")
		}
		l.put(key, rev, value)
		if l.size > bound {
			t.Fatalf("after revision %d: %d bytes held, bound %d", rev, l.size, bound)
		}
		if cost := l.recount(); cost != l.size {
			t.Fatalf("after revision %d: size says %d, what is held costs %d", rev, l.size, cost)
		}
		if len(l.order)-l.head > bound/latestOrderOverhead {
			t.Fatalf("after revision %d: %d order records", rev, len(l.order)-l.head)
		}
	}
	if _, ok := l.get([]byte("hot"), 10_000); !ok {
		t.Fatal("the newest write was let go")
	}
	if _, ok := l.get([]byte("key-99"), 9_999); !ok {
		t.Fatal("the second newest write was let go")
	}
	l.put([]byte("big"), 10_001, make([]byte, bound))
	if _, ok := l.get([]byte("big"), 10_001); ok || l.size > bound {
		t.Fatalf("a value larger than the bound was kept (size %d)", l.size)
	}
}

// recount is what the held values and order records cost, counted afresh.
func (l *latestValues) recount() int {
	n := 0
	for k, v := range l.byKey {
		n += valueCost(k, v.value)
	}
	for _, kr := range l.order[l.head:] {
		n += latestOrderOverhead + len(kr.key)
	}
	return n
}
