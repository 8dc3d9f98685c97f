package leasesvc_test

import (
	"os"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
)

// TestMain lets `make test-fdb` run this package's tests on FoundationDB.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
