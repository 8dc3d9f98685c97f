package record

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/revision"
)

var update = flag.Bool("update", false, "rewrite the golden file")

// TestGoldenEncoding pins the stored records' encoding, as keyspace's golden
// test pins the keys: changing it orphans every stored byte, so a change
// here must be deliberate (run with -update). Each record also decodes back.
func TestGoldenEncoding(t *testing.T) {
	var b strings.Builder
	line := func(name string, v []byte) { fmt.Fprintf(&b, "%-34s %s\n", name, hex.EncodeToString(v)) }
	prev := Meta{ModRev: 3, CreateRev: 2, Version: 2, Lease: 7}
	metas := map[string]Meta{
		"Meta(live)":             {ModRev: 9, CreateRev: 4, Version: 3, Lease: -1},
		"Meta(staged tombstone)": {ModRev: 10, Tombstone: true, Prev: &prev},
	}
	for _, name := range []string{"Meta(live)", "Meta(staged tombstone)"} {
		enc := EncodeMeta(metas[name])
		line(name, enc)
		if got, err := DecodeMeta(enc); err != nil || !reflect.DeepEqual(got, metas[name]) {
			t.Errorf("%s decodes to %+v, %v", name, got, err)
		}
	}
	ver := Version{Sub: 1, CreateRev: 4, Version: 3, Lease: 7, Chunks: 2, ValueLen: 5, First: []byte("abc")}
	line("Version", EncodeVersion(ver))
	if got, err := DecodeVersion(EncodeVersion(ver)); err != nil || !reflect.DeepEqual(got, ver) {
		t.Errorf("Version decodes to %+v, %v", got, err)
	}
	entry := LogEntry{ID: revision.RequestID{Writer: 1, Seq: 2, Index: 3},
		Events: []LogEvent{{Type: EventPut, Sub: 0, Key: []byte("a")}, {Type: EventDelete, Sub: 1, PrevRev: 5, Key: []byte("b")}}}
	parts := EncodeLog(entry)
	for i, p := range parts {
		line(fmt.Sprintf("Log part %d", i), p)
	}
	if got, err := DecodeLog(parts); err != nil || !reflect.DeepEqual(got, entry) {
		t.Errorf("log decodes to %+v, %v", got, err)
	}
	c := Compaction{Requested: 8, Finished: 6, Part: 2, By: revision.RequestID{Writer: 1, Seq: 4, Index: 0}}
	line("Compaction", EncodeCompaction(c))
	if got, err := DecodeCompaction(EncodeCompaction(c)); err != nil || got != c {
		t.Errorf("compaction decodes to %+v, %v", got, err)
	}
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
		t.Fatalf("record encoding changed:\n got:\n%s\nwant:\n%s", b.String(), want)
	}
}
