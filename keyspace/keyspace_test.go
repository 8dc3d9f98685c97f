package keyspace

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden file")

// TestGoldenEncoding pins the on-disk key layout: changing it orphans every
// stored byte, so a change here must be deliberate (run with -update).
func TestGoldenEncoding(t *testing.T) {
	var b strings.Builder
	line := func(name string, k []byte) { fmt.Fprintf(&b, "%-28s %s\n", name, hex.EncodeToString(k)) }
	line("Head", Head)
	line("Compaction", Compaction)
	line("Pending", Pending)
	line("PendingBeat", PendingBeat)
	line("ReadPin(9, 2)", ReadPin(9, 2))
	line("Singleton(lease-owner)", Singleton("lease-owner"))
	line("Latest(/registry/a)", Latest([]byte("/registry/a")))
	line("History(a\\x00b, 258)", History([]byte("a\x00b"), 258))
	line("HistoryPrefix(a)", HistoryPrefix([]byte("a")))
	line("Chunk(a, 7, 2)", Chunk([]byte("a"), 7, 2))
	line("Log(9, 1)", Log(9, 1))
	line("LogFrom(9)", LogFrom(9))
	line("Attach(5, k)", Attach(5, []byte("k")))
	line("Lease(5)", Lease(5))
	line("Batch(1, 2)", Batch(1, 2))
	line("TenantPrefix(3)", TenantPrefix(3))
	line("TenantRecord(acme)", TenantRecord("acme"))
	line("TenantLastID", TenantLastID)
	line("TenantLive(3)", TenantLive(3))
	line("ProcessBeat(3)", ProcessBeat(3))
	line("ProcessDeposed(3)", ProcessDeposed(3))
	line("JournalCounter", JournalCounter)
	line("JournalRecord(3, 1)", JournalRecord(3, 1))
	path := filepath.Join("testdata", "encoding.golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Fatalf("key encoding changed:\n got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// FuzzHistoryKey checks that history keys round-trip and sort by etcd key,
// then revision — the property range reads and compaction rely on.
func FuzzHistoryKey(f *testing.F) {
	f.Add([]byte("a"), int64(1), []byte("a\x00"), int64(2))
	f.Add([]byte("a\x00"), int64(5), []byte("a"), int64(7))
	f.Add([]byte("\x00\xff"), int64(1<<40), []byte("\x00"), int64(0))
	f.Fuzz(func(t *testing.T, k1 []byte, r1 int64, k2 []byte, r2 int64) {
		if r1 < 0 || r2 < 0 {
			return
		}
		h1, h2 := History(k1, r1), History(k2, r2)
		gk, gr, err := ParseHistory(h1)
		if err != nil || !bytes.Equal(gk, k1) || gr != r1 {
			t.Fatalf("round trip of %q@%d: %q@%d %v", k1, r1, gk, gr, err)
		}
		want := bytes.Compare(k1, k2)
		if want == 0 {
			want = cmpInt(r1, r2)
		}
		if got := bytes.Compare(h1, h2); got != want {
			t.Fatalf("order of %q@%d vs %q@%d: %d, want %d", k1, r1, k2, r2, got, want)
		}
		if !bytes.HasPrefix(h1, HistoryPrefix(k1)) {
			t.Fatal("history key outside its prefix")
		}
		if bytes.Equal(k1, k2) {
			return
		}
		if bytes.HasPrefix(h2, HistoryPrefix(k1)) {
			t.Fatalf("prefix of %q covers %q", k1, k2)
		}
	})
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestHeadAndCompaction: the range holds the two records and no other key
// of the meta family, so a reader that takes it for both reads nothing
// else.
func TestHeadAndCompaction(t *testing.T) {
	begin, end := HeadAndCompaction()
	in := func(k []byte) bool { return bytes.Compare(k, begin) >= 0 && bytes.Compare(k, end) < 0 }
	for _, k := range [][]byte{Head, Compaction} {
		if !in(k) {
			t.Errorf("%q is outside [%q, %q)", k, begin, end)
		}
	}
	pinsBegin, pinsEnd := ReadPins()
	for _, k := range [][]byte{Pending, PendingBeat, ReadPin(0, 0), ReadPin(1<<62, 1<<63), pinsBegin, pinsEnd} {
		if in(k) {
			t.Errorf("%q is inside [%q, %q)", k, begin, end)
		}
	}
}
