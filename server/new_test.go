package server_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/autocompact"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// refuseMemberWrites fails every transaction that writes a member record:
// New then fails at its last steps (registering this member), after the
// store, ownership, the lessor, the compactor, the alarms and the quota
// have started.
type refuseMemberWrites struct{ storage.DB }

var errRefused = errors.New("test: member writes refused")

func (d refuseMemberWrites) Update(ctx context.Context, fn func(storage.Tx) error) error {
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		w := &watchMemberWrites{Tx: tx}
		if err := fn(w); err != nil {
			return err
		}
		if w.member {
			return errRefused
		}
		return nil
	})
}

type watchMemberWrites struct {
	storage.Tx
	member bool
}

func (t *watchMemberWrites) Set(key, value []byte) {
	t.member = t.member || bytes.HasPrefix(key, keyspace.Singleton("member/"))
	t.Tx.Set(key, value)
}

// TestNewFailingLateLeaksNoGoroutine: every goroutine New started before
// the failing step is stopped when New returns its error.
func TestNewFailingLateLeaksNoGoroutine(t *testing.T) {
	db := testdb.Open(t)
	before := map[string]bool{}
	for _, g := range goroutines() {
		before[goroutineID(g)] = true
	}
	cfg := server.Config{Logger: zap.NewNop(), ForwardWrites: true}
	cfg.AutoCompaction = autocompact.Config{Mode: autocompact.Periodic, Period: time.Hour}
	if _, err := server.New(cfg, refuseMemberWrites{db}); !errors.Is(err, errRefused) {
		t.Fatalf("New = %v, want the refused member write", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var leaked []string
		for _, g := range goroutines() {
			if !before[goroutineID(g)] && startedByServer(g) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of this module or gRPC outlive the failed New:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goroutines returns the stack of every goroutine.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID is the "goroutine N" that heads a stack.
func goroutineID(stack string) string {
	id, _, _ := strings.Cut(stack, " [")
	return id
}

// startedByServer reports whether a goroutine runs code of this module or
// gRPC: what a server leaves behind. The storage backend's own goroutines
// are the db's, which the caller closes.
func startedByServer(stack string) bool {
	return strings.Contains(stack, "github.com/fdb-etcd/fdb-etcd/") || strings.Contains(stack, "google.golang.org/grpc")
}

// sharedStore is a store shared among keyspaces (as a tenant's is): it
// counts the transactions run through UpdateShared.
type sharedStore struct {
	storage.DB
	shared atomic.Int64
}

func (d *sharedStore) UpdateShared(ctx context.Context, keys, outerKeys [][]byte, fn func(tx, outer storage.Tx) error) error {
	d.shared.Add(1)
	return d.DB.Update(ctx, func(tx storage.Tx) error { return fn(tx, nil) })
}

var _ owner.SharedUpdater = (*sharedStore)(nil)

// TestElectionUsesSharedStore: on a store that shares transactions among
// keyspaces, the server's owner election runs on it, not on the wrapper
// that measures the store's transactions, which would hide the capability
// and leave every tenant renewing in a transaction of its own.
func TestElectionUsesSharedStore(t *testing.T) {
	db := &sharedStore{DB: testdb.Open(t)}
	srv, err := server.New(server.Config{Logger: zap.NewNop()}, db)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	// The election's first tick runs before New returns.
	if n := db.shared.Load(); n == 0 {
		t.Fatal("the owner election ran no transaction through UpdateShared")
	}
}
