//go:build !fdbetcd_testhooks

package main

import (
	"flag"
	"io"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// testHooks is empty in a release build: the robustness suite's hooks
// (testhooks.go) are compiled only with the fdbetcd_testhooks build tag.
type testHooks struct{}

// registerTestFlags adds no flag: a release build has no test hooks.
func registerTestFlags(*flag.FlagSet, *testHooks) {}

// testSubcommand finds no test-only subcommand in a release build.
func testSubcommand(string) func(args []string, out io.Writer) error { return nil }

// wrap returns db unchanged.
func (*testHooks) wrap(db storage.DB, _ *zap.Logger) (storage.DB, error) { return db, nil }
