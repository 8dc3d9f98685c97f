//go:build fdb

// Command fdb-raw is the benchmark's plain FoundationDB client, the fdb-raw
// and fdb-raw-batched columns: for each row it does the least FoundationDB
// work the row's logical operation needs, with the Go bindings fdb-etcd uses
// (API version 730), as a process of its own talking to the same cluster, as
// fdb-etcd does. It measures FoundationDB's ceiling on the host, next to
// which fdb-etcd's FoundationDB columns are read.
//
// The harness runs it once per row,
//
//	fdb-raw -cluster-file FILE -keyspace NAME -spec '{"op":"write",...}'
//
// with a workload.RawSpec, and reads a workload.Result as JSON from its
// standard output. Its keys live under the tuple encoding of NAME, as
// fdb-etcd's keys live under its --fdb-prefix, so the harness clears them
// the same way.
//
// It needs cgo and libfdb_c, so it builds only with the tag fdb.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/apple/foundationdb/bindings/go/src/fdb"
	"github.com/apple/foundationdb/bindings/go/src/fdb/tuple"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// apiVersion is fdb-etcd's (storage/fdb.DefaultAPIVersion).
const apiVersion = 730

func main() {
	err := run()
	// The client's network thread must end before the process's exit
	// handlers run (apple/foundationdb#3015).
	if serr := fdb.StopNetwork(); serr != nil && !errors.Is(serr, fdb.ErrNetworkNotStarted) && err == nil {
		err = serr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fdb-raw:", err)
		os.Exit(1)
	}
}

func run() error {
	clusterFile := flag.String("cluster-file", "", "FoundationDB cluster file (default: FoundationDB's own default)")
	keyspace := flag.String("keyspace", "", "keyspace name: every key lives under its tuple encoding")
	specJSON := flag.String("spec", "", "the row's work, a workload.RawSpec as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	if *keyspace == "" {
		return errors.New("-keyspace is required")
	}
	var spec workload.RawSpec
	if err := json.Unmarshal([]byte(*specJSON), &spec); err != nil {
		return fmt.Errorf("-spec: %w", err)
	}
	if err := fdb.APIVersion(apiVersion); err != nil {
		return fmt.Errorf("select API version %d: %w", apiVersion, err)
	}
	db, err := fdb.OpenDatabase(*clusterFile)
	if err != nil {
		return fmt.Errorf("open cluster file %q: %w", *clusterFile, err)
	}
	// The bindings take no context: each transaction, retries included,
	// gives up after the time the harness gives one request.
	if err := db.Options().SetTransactionTimeout(spec.P.OpTimeout.Milliseconds()); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &client{db: db, base: append(tuple.Tuple{*keyspace}.Pack(), spec.Prefix...), spec: spec}
	res, err := c.run(ctx)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// client runs one row against one keyspace.
type client struct {
	db fdb.Database
	// base is the keyspace prefix followed by the row's RawSpec.Prefix.
	base []byte
	spec workload.RawSpec
}

func (c *client) run(ctx context.Context) (workload.Result, error) {
	switch c.spec.Op {
	case workload.RawWrite, workload.RawCreate:
		return c.writes(ctx)
	case workload.RawGet, workload.RawGetRecent:
		return c.gets(ctx)
	case workload.RawList, workload.RawListPages, workload.RawCount:
		return c.list(ctx)
	case workload.RawWatch:
		return c.watch(ctx)
	}
	return workload.Result{}, fmt.Errorf("unknown operation %q", c.spec.Op)
}

// key is the row's key with suffix s.
func (c *client) key(s string) fdb.Key {
	return fdb.Key(append(append([]byte(nil), c.base...), s...))
}

// value is a payload of n bytes.
func value(n int) []byte { return []byte(workload.Value(n)) }
