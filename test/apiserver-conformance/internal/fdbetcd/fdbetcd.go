// Package fdbetcd builds the fdb-etcd binary from this repository and starts
// throwaway fdb-etcd servers on loopback ports for the conformance tests.
package fdbetcd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EnvBinary names a prebuilt fdb-etcd binary to use instead of building one.
const EnvBinary = "FDB_ETCD_BINARY"

// EnvArgs holds extra fdb-etcd arguments (space separated), e.g.
// "--backend=fdb --fdb-cluster-file=/etc/foundationdb/fdb.cluster". With
// --backend=fdb every server gets its own --fdb-prefix.
const EnvArgs = "FDB_ETCD_ARGS"

var (
	buildOnce sync.Once
	binPath   string
	binTmp    string // the directory Binary built into, removed by Cleanup
	buildErr  error
	flagsOnce sync.Once
	helpText  string
)

// EnvRepo names the fdb-etcd repository to build the server from (default:
// the nearest directory above this source file holding cmd/fdb-etcd).
const EnvRepo = "FDB_ETCD_REPO"

// RepoRoot is the fdb-etcd repository root.
func RepoRoot() (string, error) {
	if r := os.Getenv(EnvRepo); r != "" {
		return filepath.Abs(r)
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("no caller information")
	}
	for dir := filepath.Dir(file); ; {
		if st, err := os.Stat(filepath.Join(dir, "cmd", "fdb-etcd")); err == nil && st.IsDir() {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no cmd/fdb-etcd above %s: set %s or %s", file, EnvRepo, EnvBinary)
		}
		dir = parent
	}
}

// Binary returns the path of an fdb-etcd binary built once per process from
// the repository's working tree (or $FDB_ETCD_BINARY), with the fdb build
// tag when the FoundationDB half runs (FDBWanted): cgo then links libfdb_c
// as CGO_CFLAGS and CGO_LDFLAGS say (make fdb-env).
func Binary() (string, error) {
	buildOnce.Do(func() {
		if b := os.Getenv(EnvBinary); b != "" {
			if _, err := os.Stat(b); err != nil {
				buildErr = fmt.Errorf("%s=%s: %w", EnvBinary, b, err)
				return
			}
			binPath = b
			return
		}
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "fdb-etcd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binTmp = dir
		out := filepath.Join(dir, "fdb-etcd")
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		build := []string{"build", "-o", out}
		withFDB, _, err := FDBWanted()
		if err != nil {
			buildErr = err
			return
		}
		if withFDB {
			build = append(build, "-tags", "fdb")
		}
		build = append(build, "./cmd/fdb-etcd")
		start := time.Now()
		// Two tries: a build racing with another go command trimming the
		// shared build cache can fail spuriously ("could not import ...").
		for try := 0; try < 2; try++ {
			cmd := exec.Command(goBin, build...)
			cmd.Dir = root
			if withFDB {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
			}
			var buf bytes.Buffer
			cmd.Stdout, cmd.Stderr = &buf, &buf
			if err := cmd.Run(); err != nil {
				buildErr = fmt.Errorf("(cd %s && go %s): %v\n%s", root, strings.Join(build, " "), err, buf.String())
				time.Sleep(2 * time.Second)
				continue
			}
			buildErr = nil
			break
		}
		if buildErr != nil {
			return
		}
		fmt.Fprintf(os.Stderr, "fdbetcd: built %s in %v\n", out, time.Since(start).Round(time.Millisecond))
		binPath = out
	})
	return binPath, buildErr
}

// Cleanup removes the binary Binary built (call it from TestMain).
func Cleanup() {
	if binTmp != "" {
		os.RemoveAll(binTmp)
	}
}

// Supports reports whether the binary accepts the named flag (e.g.
// "--experimental-watch-progress-notify-interval").
func Supports(flagName string) bool {
	flagsOnce.Do(func() {
		b, err := Binary()
		if err != nil {
			return
		}
		out, _ := exec.Command(b, "--help").CombinedOutput()
		helpText = string(out)
	})
	return strings.Contains(helpText, strings.TrimLeft(flagName, "-")+" ")
}

// Options configure one server.
type Options struct {
	// ProgressNotifyInterval sets --experimental-watch-progress-notify-interval (0: server default).
	ProgressNotifyInterval time.Duration
	// Args are appended to the command line.
	Args []string
	// DataDir is used instead of a fresh temporary directory (restart tests).
	DataDir string
	// LogPath receives the server's output (default: DataDir/../fdb-etcd.log).
	LogPath string
	// Port to listen on (0: a free one); set it to restart a server in place.
	Port int
	// Name is --name (default "conformance").
	Name string
	// FDBClusterFile runs the server on FoundationDB (--backend=fdb) in the
	// keyspace FDBPrefix.
	FDBClusterFile, FDBPrefix string
	// TLS, when set, serves https with client certificates required.
	TLS *TLS
}

// TLS is what a server needs to serve https with client certificates
// (--cert-file, --key-file, --trusted-ca-file, --client-cert-auth), and
// the client certificate its readiness probe connects with.
type TLS struct {
	CAFile, CertFile, KeyFile   string
	ProbeCertFile, ProbeKeyFile string
}

// ClientConfig is the TLS configuration of a client holding certFile and
// keyFile that trusts the CA of t.
func (t *TLS) ClientConfig(certFile, keyFile string) (*tls.Config, error) {
	return transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: t.CAFile}.ClientConfig()
}

func (t *TLS) args() []string {
	return []string{"--cert-file=" + t.CertFile, "--key-file=" + t.KeyFile, "--trusted-ca-file=" + t.CAFile, "--client-cert-auth"}
}

// Server is a running fdb-etcd process.
type Server struct {
	URL      string // http://127.0.0.1:port (https with Options.TLS)
	Port     int
	DataDir  string
	LogPath  string
	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start starts a server and waits until it answers a linearizable Get.
func Start(o Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := start(bin, o)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(bin string, o Options) (*Server, error) {
	port, err := o.Port, error(nil)
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	dataDir := o.DataDir
	if dataDir == "" {
		dataDir, err = os.MkdirTemp("", "fdb-etcd-data-")
		if err != nil {
			return nil, err
		}
	}
	logPath := o.LogPath
	if logPath == "" {
		logPath = dataDir + ".log"
	}
	scheme := "http"
	if o.TLS != nil {
		scheme = "https"
	}
	url := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	name := o.Name
	if name == "" {
		name = "conformance"
	}
	args := []string{
		"--name", name,
		"--data-dir", dataDir,
		"--listen-client-urls", url,
		"--advertise-client-urls", url,
		"--log-format", "console",
		"--log-level", "warn",
	}
	if o.ProgressNotifyInterval > 0 {
		args = append(args, "--experimental-watch-progress-notify-interval", o.ProgressNotifyInterval.String())
	}
	if o.TLS != nil {
		args = append(args, o.TLS.args()...)
	}
	if o.FDBClusterFile != "" {
		args = append(args, "--backend=fdb", "--fdb-cluster-file="+o.FDBClusterFile, "--fdb-prefix="+o.FDBPrefix)
	}
	extra := strings.Fields(os.Getenv(EnvArgs))
	args = append(args, extra...)
	for _, a := range extra {
		if a == "--backend=fdb" {
			args = append(args, "--fdb-prefix=conformance-"+randHex(6))
		}
	}
	args = append(args, o.Args...)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	s := &Server{URL: url, Port: port, DataDir: dataDir, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	if err := s.waitReady(o.TLS, 30*time.Second); err != nil {
		s.Kill()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("fdb-etcd %v not ready: %v\n%s", args, err, tail(string(log), 3000))
	}
	return s, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (s *Server) waitReady(t *TLS, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// A client dialled before the port listens waits out gRPC's reconnect
	// backoff (1 s) before its first request can succeed: a second a server
	// on every test. So the port is polled first, cheaply.
	if err := s.waitListening(deadline); err != nil {
		return err
	}
	var tlsCfg *tls.Config
	if t != nil {
		var err error
		if tlsCfg, err = t.ClientConfig(t.ProbeCertFile, t.ProbeKeyFile); err != nil {
			return err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.URL}, DialTimeout: 2 * time.Second, TLS: tlsCfg, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		select {
		case <-s.done:
			return fmt.Errorf("exited: %v", s.waitErr)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "/health")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitListening returns once the server's port accepts connections.
func (s *Server) waitListening(deadline time.Time) error {
	addr := fmt.Sprintf("127.0.0.1:%d", s.Port)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("exited: %v", s.waitErr)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop sends SIGTERM and waits (SIGKILL after 10 s).
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Kill stops the process at once.
func (s *Server) Kill() {
	s.stopOnce.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
}

// Exited reports whether the process has ended, and how.
func (s *Server) Exited() (bool, error) {
	select {
	case <-s.done:
		return true, s.waitErr
	default:
		return false, nil
	}
}

// StartT starts a server for one test; it is stopped and its data removed at
// the test's end. The log is kept when the test failed and printed in part.
func StartT(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := Start(o)
	if err != nil {
		t.Fatalf("starting fdb-etcd: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if exited, err := s.Exited(); exited && err != nil && !strings.Contains(err.Error(), "signal") {
			t.Errorf("fdb-etcd exited with %v (log %s)", err, s.LogPath)
		}
		if t.Failed() {
			log, _ := os.ReadFile(s.LogPath)
			t.Logf("fdb-etcd log %s (tail):\n%s", s.LogPath, tail(string(log), 4000))
			return
		}
		if o.DataDir == "" {
			os.RemoveAll(s.DataDir)
			os.Remove(s.LogPath)
		}
	})
	return s
}
