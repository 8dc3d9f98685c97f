package main

import (
	"fmt"
	"os"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// openBackend opens the store --backend names: Pebble in --data-dir
// (without fsync under --unsafe-no-fsync, as etcd skips its own), or
// FoundationDB.
func openBackend(c *etcdConfig) (storage.DB, error) {
	switch c.Backend {
	case "fdb":
		return openFDB(c)
	default:
		if err := os.MkdirAll(c.dataDir(), 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		return pebble.Open(c.dataDir(), pebble.Options{NoSync: c.UnsafeNoFsync})
	}
}
