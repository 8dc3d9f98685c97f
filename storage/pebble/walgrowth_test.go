package pebble

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A WAL's length doubles ahead of its writes up to the largest memtable,
// then grows by that much; every write lands in space already allocated, and
// other files are left alone.
func TestWALLengthGrowsAheadOfWrites(t *testing.T) {
	var sizes []int64
	fs := walPreallocFS{FS: vfs.NewMem(), allocate: func(_ vfs.File, size int64) error {
		sizes = append(sizes, size)
		return nil
	}}
	f, err := fs.Create("000001.log", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	w := f.(*walFile)
	chunk := make([]byte, 256<<10)
	for w.written < 3*walMaxAlloc {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if w.written > w.length {
			t.Fatalf("wrote %d bytes into a file allocated to %d", w.written, w.length)
		}
	}
	want := []int64{1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, 192 << 20}
	if len(sizes) != len(want) {
		t.Fatalf("allocations %v, want %v", sizes, want)
	}
	for i := range want {
		if sizes[i] != want[i] {
			t.Fatalf("allocations %v, want %v", sizes, want)
		}
	}

	other, err := fs.Create("000002.sst", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := other.(*walFile); ok {
		t.Fatal("an sstable was wrapped as a WAL")
	}
}

var errNoFallocate = errors.New("fallocate: operation not supported")

// A filesystem that cannot allocate is asked once, and writes go on.
func TestWALAllocationFailureIsNotFatal(t *testing.T) {
	calls := 0
	fs := walPreallocFS{FS: vfs.NewMem(), allocate: func(vfs.File, int64) error {
		calls++
		return errNoFallocate
	}}
	f, err := fs.Create("000001.log", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := f.Write(make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("allocate called %d times, want 1", calls)
	}
}
