//go:build !fdb

package testdb

import (
	"fmt"
	"os"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

const notCompiled = EnvBackend + "=fdb, but the tests were built without -tags fdb"

// mainFDB fails rather than quietly running on Pebble: a run that asked for
// FoundationDB must not pass without touching it.
func mainFDB(*testing.M) int {
	fmt.Fprintln(os.Stderr, notCompiled)
	return 1
}

func openFDB(t testing.TB) storage.DB {
	t.Fatal(notCompiled)
	return nil
}
