// Package testdb opens the store a test runs on: a Pebble store in the test's
// temp dir, or, when FDB_ETCD_TEST_BACKEND=fdb and the tests were built with
// the fdb tag (as `make test-fdb` does), a fresh keyspace on a real
// FoundationDB cluster. The suites above the storage interface use it so the
// same tests cover both backends.
package testdb

import (
	"os"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// EnvBackend selects the backend: "fdb", or anything else for Pebble.
const EnvBackend = "FDB_ETCD_TEST_BACKEND"

// Backend is "fdb" or "pebble".
func Backend() string {
	if os.Getenv(EnvBackend) == "fdb" {
		return "fdb"
	}
	return "pebble"
}

// Main runs a package's tests; on FoundationDB it starts the throwaway
// cluster they share (unless FDB_CLUSTER_FILE names one) and stops it after.
// Call it from TestMain: os.Exit(testdb.Main(m)).
func Main(m *testing.M) int {
	if Backend() == "fdb" {
		return mainFDB(m)
	}
	return m.Run()
}

// PebbleOnly skips t on FoundationDB. It is for a test that opens Pebble
// itself, on a crash-simulating filesystem: the backend under test does not
// change what it runs, and the embedded run has run it already.
func PebbleOnly(t testing.TB) {
	t.Helper()
	if Backend() != "pebble" {
		t.Skip("opens Pebble itself; the run on the embedded backend covers it")
	}
}

// Open returns a fresh, empty store, closed when t ends. Pebble runs without
// fsync: these tests are about behaviour above the storage interface, and
// durability has its own crash tests.
func Open(t testing.TB) storage.DB {
	t.Helper()
	if Backend() == "fdb" {
		return openFDB(t)
	}
	db, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
