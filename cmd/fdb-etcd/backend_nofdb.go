//go:build !fdb

package main

import (
	"errors"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

func openFDB(*etcdConfig) (storage.DB, error) {
	return nil, errors.New("--backend=fdb: FoundationDB support is not compiled into this binary; rebuild with `go build -tags fdb` (needs cgo and libfdb_c 7.3)")
}

func stopFDB() error { return nil }
