//go:build fdb

package fdbtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

// EnvRequired, when set to a non-empty value, turns "FoundationDB is not
// available" from a skip into a failure.
const EnvRequired = "FDB_TESTS_REQUIRED"

// startTimeout bounds starting and configuring the throwaway server.
const startTimeout = 90 * time.Second

var (
	once        sync.Once
	clusterFile string
	startErr    error
	srv         *server // nil when the cluster came from FDB_CLUSTER_FILE
)

// Unavailable returns why FoundationDB tests cannot run here, or "".
func Unavailable() string {
	if cf := os.Getenv("FDB_CLUSTER_FILE"); cf != "" {
		if _, err := os.Stat(cf); err != nil {
			return fmt.Sprintf("FDB_CLUSTER_FILE=%s: %v", cf, err)
		}
		return ""
	}
	for _, bin := range []string{"fdbserver", "fdbcli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found on PATH (and FDB_CLUSTER_FILE is not set)"
		}
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
	if srv != nil {
		srv.stop(code != 0)
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
		srv, startErr = startServer()
		if startErr == nil {
			clusterFile = srv.clusterFile
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

// --- the throwaway server ----------------------------------------------------

type server struct {
	dir         string
	clusterFile string
	cmd         *exec.Cmd
	exited      chan struct{}
	waitErr     error
}

func startServer() (*server, error) {
	dir, err := os.MkdirTemp("", "fdbtest-")
	if err != nil {
		return nil, err
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		s, err := tryStart(dir, attempt)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("%w (logs in %s)", errors.Join(errs...), dir)
}

func tryStart(root string, attempt int) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, strconv.Itoa(attempt))
	for _, sub := range []string{"data", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var id [8]byte
	_, _ = rand.Read(id[:])
	cf := filepath.Join(dir, "fdb.cluster")
	if err := os.WriteFile(cf, []byte("fdbtest:"+hex.EncodeToString(id[:])+"@"+addr+"\n"), 0o644); err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(dir, "fdbserver.out"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command("fdbserver",
		"--public-address", addr, "--listen-address", addr,
		"--cluster-file", cf,
		"--datadir", filepath.Join(dir, "data"),
		"--logdir", filepath.Join(dir, "logs"))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{dir: root, clusterFile: cf, cmd: cmd, exited: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(startTimeout)
	if err := s.cli(deadline, "configure new single memory", "Database created"); err != nil {
		s.kill()
		return nil, fmt.Errorf("configure new single memory: %w", err)
	}
	if err := s.cli(deadline, "status minimal", "The database is available"); err != nil {
		s.kill()
		return nil, fmt.Errorf("wait until available: %w", err)
	}
	return s, nil
}

// cli runs fdbcli --exec command until its output contains want.
func (s *server) cli(deadline time.Time, command, want string) error {
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(s.clusterFile), "fdbserver.out"))
			return fmt.Errorf("fdbserver exited (%v): %s", s.waitErr, strings.TrimSpace(string(log)))
		default:
		}
		out, _ := exec.Command("fdbcli", "--cluster-file", s.clusterFile, "--timeout", "10",
			"--exec", command).CombinedOutput()
		last = strings.TrimSpace(string(out))
		if strings.Contains(last, want) {
			return nil
		}
		if command == "configure new single memory" && strings.Contains(last, "already exists") {
			return nil // an earlier try got through but timed out before saying so
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("fdbcli --exec %q: no %q before the deadline; last output: %s", command, want, last)
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// stop ends the server and removes its files, unless keep (tests failed: its
// logs may tell why).
func (s *server) stop(keep bool) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.kill()
	}
	if keep {
		fmt.Fprintf(os.Stderr, "fdbtest: fdbserver files kept in %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
