package pebble

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// walPreallocFS gives every WAL file its full length up front, as etcd does
// for its WAL segments. Pebble preallocates with FALLOC_FL_KEEP_SIZE, so each
// synced append still grows the file, and fdatasync then has to commit the
// new size to the filesystem journal as well as the data: on ext4 that was
// 190 us per write+fdatasync against 135 us into space whose size is already
// set, and one such sync is the floor of every acknowledged write.
//
// Pebble reads past the zeros this leaves after a WAL's last record: a
// closed WAL ends with an EOF trailer, and a zeroed tail on the newest WAL is
// the unclean end it tolerates after a crash (the case WAL recycling also
// produces).
type walPreallocFS struct {
	vfs.FS
	size     int64
	allocate func(f vfs.File, size int64) error
}

func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

func (fs walPreallocFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err == nil && isWAL(name) {
		fs.extend(f)
	}
	return f, err
}

func (fs walPreallocFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err == nil && isWAL(newname) {
		fs.extend(f)
	}
	return f, err
}

// extend is best effort: a filesystem without fallocate only loses the
// speed-up.
func (fs walPreallocFS) extend(f vfs.File) {
	if st, err := f.Stat(); err == nil && st.Size() >= fs.size {
		return
	}
	_ = fs.allocate(f, fs.size)
}
