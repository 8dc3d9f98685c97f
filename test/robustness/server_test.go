package robustness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/tests/v3/robustness/model"

	"github.com/fdb-etcd/fdb-etcd/internal/freeport"
)

// binary is the fdb-etcd under test: ROBUSTNESS_BINARY, or built by TestMain
// from ../../cmd/fdb-etcd with the test hooks (-tags fdbetcd_testhooks: the
// persisted-request journal and storage faults). binDir is where TestMain builds binaries (the
// FoundationDB scenarios build theirs there too, on first use).
var binary, binDir string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fdb-etcd-robustness-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	if b := os.Getenv("ROBUSTNESS_BINARY"); b != "" {
		binary = b
		return m.Run()
	}
	binary = filepath.Join(dir, "fdb-etcd")
	build := exec.Command("go", "build", "-tags", "fdbetcd_testhooks", "-o", binary, "./cmd/fdb-etcd")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fdb-etcd: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// server is one fdb-etcd process, on a fixed loopback port and data
// directory across restarts: on the embedded backend, or (fdbTarget) one
// replica on FoundationDB.
type server struct {
	t       testing.TB
	bin     string
	dir     string
	addr    string
	logPath string
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	starts  int
}

func freeAddr(t testing.TB) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startServer starts fdb-etcd with the persisted-request journal (so that
// the run can be validated) and any extra flags.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	return startServerBin(t, binary, extra...)
}

// startServerBin is startServer with another fdb-etcd binary.
func startServerBin(t testing.TB, bin string, extra ...string) *server {
	t.Helper()
	s := &server{t: t, bin: bin, dir: t.TempDir(), addr: freeAddr(t)}
	s.logPath = filepath.Join(s.dir, "server.log")
	s.args = append([]string{
		"--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", "http://" + s.addr,
		"--log-level", "warn",
		"--watch-progress-notify-interval", "100ms",
		"--experimental-persisted-journal",
	}, extra...)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.cmd != nil {
			s.kill9()
		}
	})
	return s
}

func (s *server) endpoint() string { return s.addr }

func (s *server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	s.cmd, s.exited = cmd, make(chan struct{})
	s.starts++
	exited := s.exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("fdb-etcd exited at start: %s", s.tail())
		default:
		}
		if c, err := net.DialTimeout("tcp", s.addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("fdb-etcd did not listen on %s: %s", s.addr, s.tail())
}

// kill9 kills the process with SIGKILL and waits for it.
func (s *server) kill9() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// stop ends the process with SIGTERM (graceful) and fails if it does not
// exit in time or exits with an error.
func (s *server) stop() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.kill9()
		s.t.Errorf("fdb-etcd did not stop within 30s of SIGTERM: %s", s.tail())
		return
	}
	if st := s.cmd.ProcessState; st != nil && !st.Success() {
		s.t.Errorf("fdb-etcd exited with %v: %s", st, s.tail())
	}
	s.cmd = nil
}

func (s *server) alive() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// rssKiB is the process's resident memory.
func (s *server) rssKiB() int64 {
	if s.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return 0
}

func (s *server) tail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// logLines returns the server log lines containing substr.
func (s *server) logLines(substr string) []string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// faultCounts sums the storage-fault counters the server logged, over every
// process lifetime (each restart starts from zero).
func (s *server) faultCounts() map[string]int64 {
	total := map[string]int64{}
	var last map[string]any
	flush := func() {
		for _, k := range []string{"retries", "unknowns", "too-old", "limit-errors", "age-jumps"} {
			if v, ok := last[k].(float64); ok {
				total[k] += int64(v)
			}
		}
		last = nil
	}
	for _, line := range s.logLines(`"msg"`) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		switch m["msg"] {
		case "TEST ONLY: injecting storage faults":
			flush() // a new process: keep the previous one's last counts
		case "storage faults injected":
			last = m
		}
	}
	flush()
	return total
}

// reportFiles: the data directory and the server log.
func (s *server) reportFiles() (dataDirs, logs map[string]string) {
	return map[string]string{"fdb-etcd": filepath.Join(s.dir, "data")}, map[string]string{"server.log": s.logPath}
}

func (s *server) endpoints() []string { return []string{s.addr} }

// name is the server's --name, or its directory's.
func (s *server) name() string {
	for i, a := range s.args {
		if a == "--name" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	return filepath.Base(s.dir)
}

// exportPersisted stops nothing: the server must already be stopped. It
// returns the requests fdb-etcd persisted, from its journal, as etcd's model
// requests, and checks them against the model (each txn must land on the
// revision the server gave it).
func (s *server) exportPersisted() ([]model.EtcdRequest, error) {
	if s.alive() {
		return nil, fmt.Errorf("export needs a stopped server")
	}
	cmd := exec.Command(binary, "experimental-export-persisted", "--data-dir", filepath.Join(s.dir, "data"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("experimental-export-persisted: %v: %s", err, errb.String())
	}
	return toModelRequests(out.Bytes())
}
