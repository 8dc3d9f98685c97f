//go:build !fdb

package fdb_test

import (
	"fmt"
	"testing"
)

func TestMain(m *testing.M) {
	fmt.Println("skipping FoundationDB tests: built without -tags fdb (they need cgo and libfdb_c; run make test-fdb)")
}
