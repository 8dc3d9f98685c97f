//go:build !linux

package pebble

import (
	"errors"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func fallocateSize(vfs.File, int64) error { return errors.New("not supported") }
