package main

import (
	"fmt"
	"os"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

func openBackend(c *config) (storage.DB, error) {
	switch c.backend {
	case "fdb":
		return openFDB(c)
	default:
		if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		return pebble.Open(c.dataDir, pebble.Options{})
	}
}
