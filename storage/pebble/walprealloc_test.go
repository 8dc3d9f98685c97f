package pebble_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// A WAL file gets its full length when it is created, so after a process
// crash the newest WAL ends in zeros rather than at its last record. Copying
// the open store's files is what a kill -9 leaves behind (every acknowledged
// write was synced); the copy must open with every acknowledged write, and
// open again after that.
func TestPreallocatedWALSurvivesCrash(t *testing.T) {
	dir := t.TempDir()
	db := open(t, dir, testOptions)
	defer db.Close()
	want := map[string]string{}
	for i := range 300 {
		set(t, db, storage.KeyValue{Key: key(i), Value: value(i)})
		want[string(key(i))] = string(value(i))
	}

	crashed := t.TempDir()
	var walLen int64
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		n := copyFile(t, filepath.Join(dir, e.Name()), filepath.Join(crashed, e.Name()))
		if strings.HasSuffix(e.Name(), ".log") {
			walLen = max(walLen, n)
		}
	}
	// 300 small writes fill well under the first 1 MiB the WAL is given,
	// so a WAL this long ends in zeros.
	if walLen < 1<<20 {
		t.Skipf("WAL files are not preallocated here (largest %d bytes): fallocate unsupported on this filesystem", walLen)
	}

	for round := range 2 {
		re := open(t, crashed, testOptions)
		got := readAll(t, re)
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("recovery %d: %q = %q, want %q", round+1, k, got[k], v)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("recovery %d: %d keys, want %d", round+1, len(got), len(want))
		}
		// Write more, so the second recovery replays a WAL written after
		// the first.
		k := []byte("after-recovery-" + string(rune('a'+round)))
		set(t, re, storage.KeyValue{Key: k, Value: k})
		want[string(k)] = string(k)
		if err := re.Close(); err != nil {
			t.Fatalf("close after recovery %d: %v", round+1, err)
		}
	}
}

func copyFile(t *testing.T, from, to string) int64 {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(out, in)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return n
}
