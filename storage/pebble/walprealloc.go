package pebble

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// walPreallocFS gives WAL files their length ahead of the writes, as etcd
// does for its WAL segments. Pebble preallocates with FALLOC_FL_KEEP_SIZE, so
// each synced append still grows the file, and fdatasync then has to commit
// the new size to the filesystem journal as well as the data: on ext4 that
// was 190 us per write+fdatasync against 135 us into space whose size is
// already set, and one such sync is the floor of every acknowledged write.
//
// A WAL's length doubles ahead of its writes, from walMinAlloc up to
// walMaxAlloc and then grows by walMaxAlloc, so a small store keeps small
// WAL files.
//
// Pebble reads past the zeros this leaves after a WAL's last record: a
// closed WAL ends with an EOF trailer, and a zeroed tail on the newest WAL is
// the unclean end it tolerates after a crash (the case WAL recycling also
// produces).
type walPreallocFS struct {
	vfs.FS
	allocate func(f vfs.File, size int64) error
}

const (
	walMinAlloc = 1 << 20
	walMaxAlloc = memTableSize
)

func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

func (fs walPreallocFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !isWAL(name) {
		return f, err
	}
	return fs.wrap(f), nil
}

func (fs walPreallocFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err != nil || !isWAL(newname) {
		return f, err
	}
	return fs.wrap(f), nil
}

func (fs walPreallocFS) wrap(f vfs.File) vfs.File {
	w := &walFile{File: f, allocate: fs.allocate}
	if st, err := f.Stat(); err == nil {
		w.length = st.Size() // a recycled WAL is overwritten from the start
	}
	return w
}

// walFile is a WAL written sequentially from offset 0, as Pebble writes them.
type walFile struct {
	vfs.File
	allocate func(f vfs.File, size int64) error
	written  int64
	length   int64
	failed   bool // the filesystem cannot allocate; stop asking
}

func (w *walFile) Write(p []byte) (int, error) {
	if end := w.written + int64(len(p)); end > w.length && !w.failed {
		size := max(w.length, walMinAlloc)
		for size < end {
			if size < walMaxAlloc {
				size = min(2*size, walMaxAlloc)
			} else {
				size += walMaxAlloc
			}
		}
		if w.allocate(w.File, size) == nil {
			w.length = size
		} else {
			w.failed = true // best effort: only the speed-up is lost
		}
	}
	n, err := w.File.Write(p)
	w.written += int64(n)
	return n, err
}
