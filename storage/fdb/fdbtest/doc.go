// Package fdbtest runs tests against a real FoundationDB cluster: the one
// named by the FDB_CLUSTER_FILE environment variable, or else a throwaway
// single-process fdbserver it starts on a free loopback port, with its data
// in a temporary directory (configured as "new single memory"), and stops when
// the tests end.
//
// A test package that needs FoundationDB carries the build tag "fdb" and
// calls Main from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(fdbtest.Main(m)) }
//
// When FoundationDB is not available (fdbserver or fdbcli not on PATH and no
// FDB_CLUSTER_FILE), Main prints one line saying so and runs nothing, unless
// FDB_TESTS_REQUIRED is set (as `make test-fdb` does), in which case it fails.
// Without the tag, and so without cgo and libfdb_c, this package is empty.
package fdbtest
