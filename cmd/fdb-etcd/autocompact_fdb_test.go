//go:build fdb

package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

const compactedMsg = "completed auto periodic compaction"

func compactions(t *testing.T, r *replica) int {
	t.Helper()
	b, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), compactedMsg)
}

// TestAutoCompactionOneReplica runs three replicas on one keyspace with
// --auto-compaction-mode=periodic --auto-compaction-retention=2s under
// writes: history is compacted, and only the owner of writes compacts;
// when it stops, the next owner does.
func TestAutoCompactionOneReplica(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	prefix := fdbtest.NewPrefix(t)
	bin := buildFDBBinary(t)
	flags := []string{"--auto-compaction-mode=periodic", "--auto-compaction-retention=2s"}
	a := startReplica(t, bin, "a", cf, prefix, flags...)
	deadline := time.Now().Add(15 * time.Second)
	for !a.leaseOwner(t) {
		if time.Now().After(deadline) {
			t.Fatal("replica a never took ownership")
		}
		time.Sleep(100 * time.Millisecond)
	}
	b := startReplica(t, bin, "b", cf, prefix, flags...)
	c := startReplica(t, bin, "c", cf, prefix, flags...)
	write := func(d time.Duration, via ...*replica) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := via[i%len(via)].cli.Put(ctx, "k", "v"); err != nil && ctx.Err() == nil {
				t.Fatalf("put: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	write(7*time.Second, b, c)
	if n := compactions(t, a); n == 0 {
		t.Fatal("the owner did not compact")
	}
	if nb, nc := compactions(t, b), compactions(t, c); nb+nc != 0 {
		t.Fatalf("replicas that do not own writes compacted: b %d, c %d", nb, nc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.cli.Get(ctx, "k", clientv3.WithRev(2)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("Get at revision 2 after compaction: %v", err)
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	_ = a.cmd.Wait()
	write(10*time.Second, b, c)
	nb, nc := compactions(t, b), compactions(t, c)
	if (nb == 0) == (nc == 0) {
		t.Fatalf("after the owner stopped: b compacted %d times, c %d; want exactly one of them", nb, nc)
	}
	t.Logf("compactions: a %d before it stopped, then b %d, c %d", compactions(t, a), nb, nc)
}
