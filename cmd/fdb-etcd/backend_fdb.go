//go:build fdb

package main

import (
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

// openFDB opens the keyspace --fdb-prefix of the FoundationDB cluster in
// --fdb-cluster-file (see package storage/fdb for the key layout).
func openFDB(c *etcdConfig) (storage.DB, error) {
	return fdb.Open(fdb.Options{
		ClusterFile:   c.FDBClusterFile,
		Prefix:        c.FDBPrefix,
		APIVersion:    c.FDBAPIVersion,
		ClientBuggify: c.FDBBuggify,
	})
}

// stopFDB stops the FoundationDB client's network thread before the process
// exits (see fdb.StopNetwork).
func stopFDB() error { return fdb.StopNetwork() }
