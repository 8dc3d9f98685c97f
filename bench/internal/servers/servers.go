// Package servers builds and runs the servers under comparison (etcd, kine,
// fdb-etcd), one process at a time, each on a fresh temporary data directory
// and on loopback ports only.
package servers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Names of the supported servers, in default run order.
const (
	Etcd    = "etcd"
	Kine    = "kine"
	FDBEtcd = "fdb-etcd"
)

// Known lists all server names.
var Known = []string{Etcd, Kine, FDBEtcd}

// Versions of the reference servers; these must match bench/tools/*/go.mod.
var Versions = map[string]string{
	Etcd: "v3.6.16",
	Kine: "v0.17.5 (sqlite)",
}

// Layout locates the directories the harness works with.
type Layout struct {
	BenchDir string // .../bench (the harness module root)
	RepoRoot string // the fdb-etcd repository root (parent of BenchDir)
	BinDir   string // cache of built binaries (gitignored)
}

// FindLayout walks up from the working directory to the bench module root
// (accepting either the bench directory itself or the repository root).
func FindLayout(binDir string) (Layout, error) {
	dir, err := os.Getwd()
	if err != nil {
		return Layout{}, err
	}
	isBench := func(d string) bool {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		return err == nil && bytes.Contains(b, []byte("module github.com/fdb-etcd/fdb-etcd/bench\n"))
	}
	for i := 0; i < 64; i++ {
		for _, d := range []string{dir, filepath.Join(dir, "bench")} {
			if isBench(d) {
				l := Layout{BenchDir: d, RepoRoot: filepath.Dir(d), BinDir: binDir}
				if l.BinDir == "" {
					l.BinDir = filepath.Join(d, ".bin")
				}
				l.BinDir, err = filepath.Abs(l.BinDir)
				return l, err
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return Layout{}, errors.New("cannot find the bench module (run from the repository or its bench/ directory)")
}

// BuildOptions controls how binaries are obtained.
type BuildOptions struct {
	FDBEtcdBin   string // use this fdb-etcd binary instead of building one
	ForceTools   bool   // rebuild etcd and kine even if cached
	Logf         func(format string, args ...any)
	BuildTimeout time.Duration
}

// Build makes sure a binary exists for each named server and returns their
// paths. etcd and kine are built from the Go module proxy via the pinned
// scratch modules in bench/tools/{etcd,kine}, and cached in BinDir keyed by
// the hash of their go.mod+go.sum. fdb-etcd is always (re)built from the
// repository, which is cheap thanks to the Go build cache.
func Build(ctx context.Context, l Layout, names []string, o BuildOptions) (map[string]string, error) {
	if o.BuildTimeout == 0 {
		o.BuildTimeout = 20 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.BuildTimeout)
	defer cancel()
	if err := os.MkdirAll(l.BinDir, 0o755); err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, n := range names {
		switch n {
		case Etcd:
			p, err := buildTool(ctx, l, "etcd", "go.etcd.io/etcd/server/v3", "0", o)
			if err != nil {
				return nil, err
			}
			bins[n] = p
		case Kine:
			// kine's default SQLite driver (mattn/go-sqlite3) needs cgo.
			p, err := buildTool(ctx, l, "kine", "github.com/k3s-io/kine", "1", o)
			if err != nil {
				return nil, err
			}
			bins[n] = p
		case FDBEtcd:
			if o.FDBEtcdBin != "" {
				p, err := filepath.Abs(o.FDBEtcdBin)
				if err != nil {
					return nil, err
				}
				if _, err := os.Stat(p); err != nil {
					return nil, err
				}
				bins[n] = p
				continue
			}
			out := filepath.Join(l.BinDir, "fdb-etcd")
			o.Logf("building fdb-etcd from %s", l.RepoRoot)
			cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/fdb-etcd")
			cmd.Dir = l.RepoRoot
			if b, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("building fdb-etcd: %v\n%s", err, b)
			}
			bins[n] = out
		default:
			return nil, fmt.Errorf("unknown server %q (known: %s)", n, strings.Join(Known, ","))
		}
	}
	return bins, nil
}

func buildTool(ctx context.Context, l Layout, name, pkg, cgo string, o BuildOptions) (string, error) {
	modDir := filepath.Join(l.BenchDir, "tools", name)
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(modDir, f))
		if err != nil {
			return "", fmt.Errorf("scratch module for %s: %w", name, err)
		}
		h.Write(b)
	}
	stamp := hex.EncodeToString(h.Sum(nil))
	out := filepath.Join(l.BinDir, name)
	stampFile := out + ".stamp"
	if !o.ForceTools {
		if _, err := os.Stat(out); err == nil {
			if b, err := os.ReadFile(stampFile); err == nil && strings.TrimSpace(string(b)) == stamp {
				return out, nil
			}
		}
	}
	o.Logf("building %s (%s) from the module proxy; this can take a few minutes", name, pkg)
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out+".tmp", pkg)
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, b)
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		return "", err
	}
	if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
		return "", err
	}
	o.Logf("built %s in %s", name, time.Since(start).Round(time.Second))
	return out, nil
}

// Instance is one running server process.
type Instance struct {
	Name     string
	Endpoint string // host:port for clientv3
	Dir      string // temp dir holding data and logs
	LogPath  string

	cmd    *exec.Cmd
	logF   *os.File
	exited chan struct{}
	waitEr error
	keep   bool
}

// StartOptions configures Start.
type StartOptions struct {
	WorkDir      string // parent of the temp dir; "" means os.TempDir()
	Keep         bool   // keep the data dir after Stop
	ReadyTimeout time.Duration
}

// FreePort returns a currently unused loopback TCP port.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Start launches server name from bin on a fresh data dir and waits until it
// answers a range request.
func Start(ctx context.Context, name, bin string, o StartOptions) (*Instance, error) {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	dir, err := os.MkdirTemp(o.WorkDir, "fdb-etcd-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := FreePort()
	if err != nil {
		return nil, err
	}
	curl := "http://127.0.0.1:" + strconv.Itoa(cport)
	purl := "http://127.0.0.1:" + strconv.Itoa(pport)
	data := filepath.Join(dir, "data")
	var args []string
	switch name {
	case Etcd:
		args = []string{
			"--name", "bench",
			"--data-dir", data,
			"--listen-client-urls", curl,
			"--advertise-client-urls", curl,
			"--listen-peer-urls", purl,
			"--initial-advertise-peer-urls", purl,
			"--initial-cluster", "bench=" + purl,
			"--initial-cluster-state", "new",
			"--quota-backend-bytes", strconv.FormatInt(8<<30, 10),
			"--log-level", "warn",
		}
	case Kine:
		// kine's default endpoint is sqlite at ./db/state.db relative to
		// its working directory, which is the temp dir. Metrics (default
		// :8080 on all interfaces) are disabled.
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
		args = []string{
			"--listen-address", "127.0.0.1:" + strconv.Itoa(cport),
			"--metrics-bind-address", "0",
		}
	case FDBEtcd:
		args = []string{
			"--name", "bench",
			"--data-dir", data,
			"--listen-client-urls", curl,
			"--advertise-client-urls", curl,
		}
	default:
		return nil, fmt.Errorf("unknown server %q", name)
	}
	inst := &Instance{
		Name:     name,
		Endpoint: "127.0.0.1:" + strconv.Itoa(cport),
		Dir:      dir,
		LogPath:  filepath.Join(dir, "server.log"),
		exited:   make(chan struct{}),
		keep:     o.Keep,
	}
	inst.logF, err = os.Create(inst.LogPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if name == Kine {
		cmd.Dir = data
	}
	cmd.Stdout = inst.logF
	cmd.Stderr = inst.logF
	// Own process group (so a terminal ^C reaches only the harness, which
	// then stops the server cleanly) and killed if the harness dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		inst.logF.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	inst.cmd = cmd
	go func() {
		inst.waitEr = cmd.Wait()
		close(inst.exited)
	}()
	if err := inst.waitReady(ctx, o.ReadyTimeout); err != nil {
		inst.Stop()
		return nil, err
	}
	return inst, nil
}

func (i *Instance) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// Wait for the port first: a client dialled too early sits in gRPC's
	// reconnect backoff for a second.
	for attempt := 0; attempt < 10000 && time.Now().Before(deadline); attempt++ {
		select {
		case <-i.exited:
			return fmt.Errorf("%s exited during startup (%v); log tail:\n%s", i.Name, i.waitEr, i.LogTail(20))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		c, err := net.DialTimeout("tcp", i.Endpoint, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{i.Endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	var last error
	for attempt := 0; attempt < 1000 && time.Now().Before(deadline); attempt++ {
		select {
		case <-i.exited:
			return fmt.Errorf("%s exited during startup (%v); log tail:\n%s", i.Name, i.waitEr, i.LogTail(20))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, last = cli.Get(rctx, "/bench/ready-probe")
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %v; log tail:\n%s", i.Name, timeout, last, i.LogTail(20))
}

// PID is the server's process id.
func (i *Instance) PID() int { return i.cmd.Process.Pid }

// Alive reports whether the process is still running.
func (i *Instance) Alive() bool {
	select {
	case <-i.exited:
		return false
	default:
		return true
	}
}

// Stop terminates the server (SIGTERM, then SIGKILL after 10s) and removes
// its temp dir unless asked to keep it.
func (i *Instance) Stop() error {
	if i.cmd != nil && i.Alive() {
		_ = i.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-i.exited:
		case <-time.After(10 * time.Second):
			_ = i.cmd.Process.Kill()
			<-i.exited
		}
	}
	if i.logF != nil {
		i.logF.Close()
	}
	if !i.keep {
		return os.RemoveAll(i.Dir)
	}
	return nil
}

// LogTail returns the last n lines of the server's log.
func (i *Instance) LogTail(n int) string {
	f, err := os.Open(i.LogPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// RSS returns the resident set size of the process in bytes, from
// /proc/PID/status (VmRSS).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) < 1 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
