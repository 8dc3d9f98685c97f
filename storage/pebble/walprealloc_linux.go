package pebble

import (
	"errors"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// fallocateSize reserves size bytes and sets the file's length to them
// (mode 0, unlike Pebble's own FALLOC_FL_KEEP_SIZE).
func fallocateSize(f vfs.File, size int64) error {
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		return errors.New("no file descriptor")
	}
	return unix.Fallocate(int(fd), 0, 0, size)
}
