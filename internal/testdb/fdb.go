//go:build fdb

package testdb

import (
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

func mainFDB(m *testing.M) int { return fdbtest.Main(m) }

func openFDB(t testing.TB) storage.DB { return fdbtest.Open(t) }
