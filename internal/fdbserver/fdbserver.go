// Package fdbserver starts and stops a throwaway single-process FoundationDB
// server on a free loopback port, for tests. It only runs the fdbserver and
// fdbcli executables, so it needs neither cgo nor libfdb_c, and test modules
// that drive a prebuilt fdb-etcd binary can use it too.
package fdbserver

import (
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
	"syscall"
	"time"
)

// startTimeout bounds starting and configuring one attempt.
const startTimeout = 90 * time.Second

// Server is a running throwaway fdbserver.
type Server struct {
	root        string
	clusterFile string
	cmd         *exec.Cmd
	exited      chan struct{}
	waitErr     error
}

// Missing returns which of the executables Start needs is not on PATH, or "".
func Missing() string {
	for _, bin := range []string{"fdbserver", "fdbcli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found on PATH"
		}
	}
	return ""
}

// Start starts a server with its data in a new temporary directory and
// configures it as "new single memory". A port taken between choosing and
// binding it costs another attempt, not a failure.
func Start() (*Server, error) {
	if m := Missing(); m != "" {
		return nil, errors.New(m)
	}
	root, err := os.MkdirTemp("", "fdbserver-")
	if err != nil {
		return nil, err
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		s, err := tryStart(root, attempt)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("%w (logs in %s)", errors.Join(errs...), root)
}

// ClusterFile is the path of the server's cluster file.
func (s *Server) ClusterFile() string { return s.clusterFile }

func tryStart(root string, attempt int) (*Server, error) {
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
	s := &Server{root: root, clusterFile: cf, cmd: cmd, exited: make(chan struct{})}
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
func (s *Server) cli(deadline time.Time, command, want string) error {
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

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Stop ends the server and removes its files, unless keep (tests failed: its
// logs may tell why), in which case it says where they are.
func (s *Server) Stop(keep bool) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.kill()
	}
	if keep {
		fmt.Fprintf(os.Stderr, "fdbserver: files kept in %s\n", s.root)
		return
	}
	_ = os.RemoveAll(s.root)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
