package server_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
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
	cfg := server.Config{Logger: zap.NewNop(), ForwardWrites: true}
	cfg.AutoCompaction = autocompact.Config{Mode: autocompact.Periodic, Period: time.Hour}
	if _, err := server.New(cfg, refuseMemberWrites{db}); !errors.Is(err, errRefused) {
		t.Fatalf("New = %v, want the refused member write", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		leaked := leakedGoroutines()
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of this module or gRPC outlive the failed New:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leakedGoroutines returns the stacks of goroutines running code of this
// module or gRPC, other than the tests' own: what a server would leave
// behind. The storage backend's goroutines are the db's, closed by the test.
func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		ours := strings.Contains(g, "github.com/fdb-etcd/fdb-etcd/") || strings.Contains(g, "google.golang.org/grpc")
		test := strings.Contains(g, "testing.tRunner") || strings.Contains(g, "testing.(*M).Run")
		if ours && !test {
			out = append(out, g)
		}
	}
	return out
}
