//go:build fdb

package fdbtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

// EnvRequired, when set to a non-empty value, turns "FoundationDB is not
// available" from a skip into a failure.
const EnvRequired = "FDB_TESTS_REQUIRED"

var (
	once        sync.Once
	clusterFile string
	startErr    error
	srv         *fdbserver.Cluster // nil when the cluster came from FDB_CLUSTER_FILE
)

// Unavailable returns why FoundationDB tests cannot run here, or "".
func Unavailable() string {
	if cf := os.Getenv("FDB_CLUSTER_FILE"); cf != "" {
		if _, err := os.Stat(cf); err != nil {
			return fmt.Sprintf("FDB_CLUSTER_FILE=%s: %v", cf, err)
		}
		return ""
	}
	if m := fdbserver.Missing(); m != "" {
		return m + " (and FDB_CLUSTER_FILE is not set)"
	}
	return ""
}

func required() bool { return os.Getenv(EnvRequired) != "" }

// Main runs m against FoundationDB and stops the throwaway server afterwards.
// When FoundationDB is unavailable it prints one line and returns 0 without
// running anything (1 if EnvRequired is set).
func Main(m *testing.M) int {
	if reason := Unavailable(); reason != "" {
		if required() {
			fmt.Fprintf(os.Stderr, "FoundationDB tests cannot run: %s\n", reason)
			return 1
		}
		fmt.Printf("skipping FoundationDB tests: %s\n", reason)
		return 0
	}
	code := m.Run()
	if err := fdb.StopNetwork(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if srv != nil {
		srv.Stop(code != 0)
	}
	return code
}

// ClusterFile returns the cluster file of the test cluster, starting the
// throwaway server on first use. It skips t when FoundationDB is unavailable
// (fails it when EnvRequired is set) and fails t when the server won't start.
func ClusterFile(t testing.TB) string {
	t.Helper()
	if reason := Unavailable(); reason != "" {
		if required() {
			t.Fatalf("FoundationDB tests cannot run: %s", reason)
		}
		t.Skipf("skipping FoundationDB tests: %s", reason)
	}
	once.Do(func() {
		if cf := os.Getenv("FDB_CLUSTER_FILE"); cf != "" {
			clusterFile = cf
			return
		}
		srv, startErr = fdbserver.Start()
		if startErr == nil {
			clusterFile = srv.ClusterFile()
		}
	})
	if startErr != nil {
		t.Fatalf("start fdbserver: %v", startErr)
	}
	return clusterFile
}

// NewPrefix returns a fresh random keyspace name; its keys are deleted when t
// ends.
func NewPrefix(t testing.TB) string {
	t.Helper()
	cf := ClusterFile(t)
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "fdbtest/" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if err := clearKeyspace(cf, name); err != nil {
			t.Errorf("fdbtest: delete keyspace %q: %v", name, err)
		}
	})
	return name
}

// OpenPrefix opens the keyspace name of the test cluster; it is closed when t
// ends (a Close by the test itself is fine). Several handles on one name act
// like several fdb-etcd processes sharing a keyspace.
func OpenPrefix(t testing.TB, name string) *fdb.DB {
	t.Helper()
	db, err := fdb.Open(fdb.Options{ClusterFile: ClusterFile(t), Prefix: name})
	if err != nil {
		t.Fatalf("fdb.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil && !errors.Is(err, storage.ErrClosed) {
			t.Errorf("fdbtest: Close: %v", err)
		}
	})
	return db
}

// Open opens a fresh, empty keyspace of its own on the test cluster.
func Open(t testing.TB) *fdb.DB {
	t.Helper()
	return OpenPrefix(t, NewPrefix(t))
}

// clearKeyspace deletes every key of the keyspace name. Keys longer than
// storage.MaxKeySize cannot exist, so [nil, 0xff * (MaxKeySize+1)) covers all.
func clearKeyspace(clusterFile, name string) error {
	db, err := fdb.Open(fdb.Options{ClusterFile: clusterFile, Prefix: name})
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return db.Update(ctx, func(tx storage.Tx) error {
		tx.ClearRange(nil, bytes.Repeat([]byte{0xff}, storage.MaxKeySize+1))
		return nil
	})
}
