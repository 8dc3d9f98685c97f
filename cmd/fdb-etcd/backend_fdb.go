//go:build fdb

package main

import (
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

// openFDB opens the keyspace --fdb-prefix of the FoundationDB cluster in
// --fdb-cluster-file (see package storage/fdb for the key layout).
func openFDB(c *config) (storage.DB, error) {
	return fdb.Open(fdb.Options{
		ClusterFile:   c.fdbClusterFile,
		Prefix:        c.fdbPrefix,
		APIVersion:    c.fdbAPIVersion,
		ClientBuggify: c.fdbBuggify,
	})
}
