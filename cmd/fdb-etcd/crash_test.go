package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/freeport"
)

// freePort returns an address for the binary to listen on (see freeport
// for why not port 0's).
func freePort(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fdb-etcd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func startBinary(t *testing.T, bin, dataDir, addr string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "--data-dir", dataDir, "--listen-client-urls", "http://"+addr, "--log-level", "error")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server did not start")
	return nil
}

// TestKillNineKeepsAcknowledgedWrites kills the server with SIGKILL in the
// middle of a write load, restarts it on the same data directory, and checks
// that every acknowledged write is there at the revision it was given and
// that no revision is reused.
func TestKillNineKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	bin := buildBinary(t)
	dataDir := t.TempDir()
	addr := freePort(t)
	cmd := startBinary(t, bin, dataDir, addr)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	type ack struct {
		key string
		rev int64
	}
	var mu sync.Mutex
	var acks []ack
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 100_000; i++ {
				key := fmt.Sprintf("w%d/%06d", w, i)
				r, err := cli.Put(ctx, key, key)
				if err != nil {
					return
				}
				mu.Lock()
				acks = append(acks, ack{key, r.Header.Revision})
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	cancel()
	wg.Wait()
	cli.Close()
	if len(acks) == 0 {
		t.Fatal("no write was acknowledged before the kill")
	}

	cmd = startBinary(t, bin, dataDir, addr)
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	cli, err = clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	var maxRev int64
	seen := map[int64]string{}
	for _, a := range acks {
		if other, dup := seen[a.rev]; dup {
			t.Fatalf("revision %d acknowledged for %s and %s", a.rev, other, a.key)
		}
		seen[a.rev] = a.key
		maxRev = max(maxRev, a.rev)
	}
	all, err := cli.Get(rctx, "w", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, kv := range all.Kvs {
		got[string(kv.Key)] = kv.ModRevision
	}
	for _, a := range acks {
		if got[a.key] != a.rev {
			t.Fatalf("acknowledged %s at revision %d, after restart mod_revision %d", a.key, a.rev, got[a.key])
		}
	}
	if all.Header.Revision < maxRev {
		t.Fatalf("revision went back: %d < acknowledged %d", all.Header.Revision, maxRev)
	}
	p, err := cli.Put(rctx, "after", "restart")
	if err != nil {
		t.Fatal(err)
	}
	if p.Header.Revision != all.Header.Revision+1 {
		t.Fatalf("first write after restart got %d, want %d", p.Header.Revision, all.Header.Revision+1)
	}
	t.Logf("%d acknowledged writes survived SIGKILL; head %d", len(acks), all.Header.Revision)
}
