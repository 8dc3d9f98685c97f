// Package servers builds and runs the servers under comparison (etcd, kine,
// fdb-etcd on its embedded store, fdb-etcd on FoundationDB with one and with
// three replicas), one server at a time, each on a fresh temporary data
// directory (or FoundationDB keyspace) and on loopback ports only. It also
// builds the plain FoundationDB client (cmd/fdb-raw) whose columns measure
// what FoundationDB itself delivers; it has no process of its own to start,
// only a fresh keyspace.
package servers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	// FDBEtcdFDB is one fdb-etcd replica on FoundationDB.
	FDBEtcdFDB = "fdb-etcd-fdb"
	// FDBEtcdFDB3 is three fdb-etcd replicas serving one keyspace.
	FDBEtcdFDB3 = "fdb-etcd-fdb3"
	// FDBRaw is the plain FoundationDB client, one transaction per
	// operation: FoundationDB's ceiling for each row.
	FDBRaw = "fdb-raw"
	// FDBRawBatched is the same client with concurrent write operations
	// group-committed, as fdb-etcd batches them.
	FDBRawBatched = "fdb-raw-batched"
)

// Known lists all server names.
var Known = []string{Etcd, Kine, FDBEtcd, FDBEtcdFDB, FDBEtcdFDB3, FDBRaw, FDBRawBatched}

// EnvClusterFile names the environment variable that points the FoundationDB
// servers at a cluster; without it they are left out of the default set.
const EnvClusterFile = "FDB_CLUSTER_FILE"

// NeedsFDB reports whether server name runs on FoundationDB.
func NeedsFDB(name string) bool { return name == FDBEtcdFDB || name == FDBEtcdFDB3 || IsRaw(name) }

// IsRaw reports whether name is the plain FoundationDB client, which the
// harness runs per row instead of sending it requests.
func IsRaw(name string) bool { return name == FDBRaw || name == FDBRawBatched }

// Replicas is the number of processes server name runs as.
func Replicas(name string) int {
	if name == FDBEtcdFDB3 {
		return 3
	}
	return 1
}

// Default returns the servers run when none are named: all of them, minus
// the FoundationDB ones when no cluster is configured.
func Default() []string {
	var out []string
	for _, n := range Known {
		if !NeedsFDB(n) || os.Getenv(EnvClusterFile) != "" {
			out = append(out, n)
		}
	}
	return out
}

// ClusterFile returns the FoundationDB cluster file from FDB_CLUSTER_FILE,
// or why the FoundationDB servers cannot run.
func ClusterFile() (string, error) {
	cf := os.Getenv(EnvClusterFile)
	if cf == "" {
		return "", fmt.Errorf("%s is not set (make bench starts a throwaway fdbserver and sets it when FoundationDB is installed)", EnvClusterFile)
	}
	if _, err := os.Stat(cf); err != nil {
		return "", fmt.Errorf("%s: %w", EnvClusterFile, err)
	}
	return filepath.Abs(cf)
}

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
	FDBTaggedBin string // likewise for the FoundationDB servers (built with -tags fdb)
	ForceTools   bool   // rebuild etcd and kine even if cached
	Logf         func(format string, args ...any)
	BuildTimeout time.Duration
}

// Build makes sure a binary exists for each named server and returns their
// paths. etcd and kine are built from the Go module proxy via the pinned
// scratch modules in bench/tools/{etcd,kine}, and cached in BinDir keyed by
// the hash of their go.mod+go.sum. fdb-etcd is always (re)built from the
// repository, which is cheap thanks to the Go build cache; the FoundationDB
// servers share a second build with -tags fdb, which needs cgo and libfdb_c.
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
	var tagged, raw string // one build serves both FoundationDB servers, one both raw columns
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
			p, err := buildFDBEtcd(ctx, l, o.FDBEtcdBin, "fdb-etcd", false, o)
			if err != nil {
				return nil, err
			}
			bins[n] = p
		case FDBEtcdFDB, FDBEtcdFDB3:
			if tagged == "" {
				p, err := buildFDBEtcd(ctx, l, o.FDBTaggedBin, "fdb-etcd-fdb", true, o)
				if err != nil {
					return nil, err
				}
				tagged = p
			}
			bins[n] = tagged
		case FDBRaw, FDBRawBatched:
			if raw == "" {
				p, err := buildRaw(ctx, l, o)
				if err != nil {
					return nil, err
				}
				raw = p
			}
			bins[n] = raw
		default:
			return nil, fmt.Errorf("unknown server %q (known: %s)", n, strings.Join(Known, ","))
		}
	}
	return bins, nil
}

// buildFDBEtcd returns prebuilt if set, else builds ./cmd/fdb-etcd into
// BinDir/out (with the fdb tag and cgo when fdbTag).
func buildFDBEtcd(ctx context.Context, l Layout, prebuilt, out string, fdbTag bool, o BuildOptions) (string, error) {
	if prebuilt != "" {
		p, err := filepath.Abs(prebuilt)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(p); err != nil {
			return "", err
		}
		return p, nil
	}
	out = filepath.Join(l.BinDir, out)
	args := []string{"build", "-o", out}
	env := os.Environ()
	if fdbTag {
		args = append(args, "-tags", "fdb")
		env = append(env, "CGO_ENABLED=1")
	}
	o.Logf("building %s from %s", filepath.Base(out), l.RepoRoot)
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/fdb-etcd")...)
	cmd.Dir = l.RepoRoot
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		if fdbTag {
			return "", fmt.Errorf("building %s (-tags fdb needs cgo and the FoundationDB 7.3 client library): %v\n%s", filepath.Base(out), err, b)
		}
		return "", fmt.Errorf("building %s: %v\n%s", filepath.Base(out), err, b)
	}
	return out, nil
}

// buildRaw builds the plain FoundationDB client, ./cmd/fdb-raw of the bench
// module, into BinDir/fdb-raw, with the fdb tag and cgo as the FoundationDB
// servers' build (make provides the cgo flags for libfdb_c).
func buildRaw(ctx context.Context, l Layout, o BuildOptions) (string, error) {
	out := filepath.Join(l.BinDir, "fdb-raw")
	o.Logf("building fdb-raw from %s", l.BenchDir)
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "fdb", "-o", out, "./cmd/fdb-raw")
	cmd.Dir = l.BenchDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building fdb-raw (-tags fdb needs cgo and the FoundationDB 7.3 client library): %v\n%s", err, b)
	}
	return out, nil
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

// Instance is one running server: a single process, or several replicas
// serving one FoundationDB keyspace.
type Instance struct {
	Name      string
	Endpoints []string // host:port of each process, for clientv3
	Dir       string   // temp dir holding data and logs
	// Prefix is the FoundationDB keyspace (--fdb-prefix); "" off FoundationDB.
	Prefix string

	procs       []*process
	clusterFile string
	keep        bool
	pprof       bool
	cpus        string
	// ca issues the tenants' client certificates of a server started with
	// StartOptions.Tenancy; nil otherwise.
	ca   *certAuthority
	args []string // StartOptions.Args
}

// process is one server process of an Instance.
type process struct {
	name     string
	endpoint string
	logPath  string
	cmd      *exec.Cmd
	logF     *os.File
	exited   chan struct{}
	waitErr  error
}

// StartOptions configures Start.
type StartOptions struct {
	WorkDir      string // parent of the temp dir; "" means os.TempDir()
	Keep         bool   // keep the data dir (and FoundationDB keyspace) after Stop
	ReadyTimeout time.Duration
	// Pprof serves Go's /debug/pprof on the client port of the servers
	// that have it (etcd and fdb-etcd).
	Pprof bool
	// CPUs, when set, pins every server process to these CPUs (a taskset
	// list such as "0" or "0-1"), so that the load generator can be kept
	// off them.
	CPUs string
	// Tenancy serves a keyspace per client certificate
	// (--tenancy=client-cert-cn over TLS, tenants created on first use):
	// Instance.ClientTLS gives each tenant's clients their certificate.
	// Only where SupportsTenancy.
	Tenancy bool
	// Args are more flags for the server.
	Args []string
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

// Start launches server name from bin on a fresh data dir (on FoundationDB:
// a fresh keyspace, so runs never see each other's data) and waits until
// every process answers a range request. For the plain FoundationDB client
// it only prepares the keyspace and a directory for its logs.
func Start(ctx context.Context, name, bin string, o StartOptions) (*Instance, error) {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	if !slices.Contains(Known, name) {
		return nil, fmt.Errorf("unknown server %q", name)
	}
	inst := &Instance{Name: name, keep: o.Keep, pprof: o.Pprof, cpus: o.CPUs, args: o.Args}
	if o.Tenancy {
		if !SupportsTenancy(name) {
			return nil, fmt.Errorf("%s serves no tenants", name)
		}
		ca, err := newCertAuthority()
		if err != nil {
			return nil, err
		}
		inst.ca = ca
	}
	if NeedsFDB(name) {
		cf, err := ClusterFile()
		if err != nil {
			return nil, fmt.Errorf("%s needs FoundationDB: %w", name, err)
		}
		var id [8]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
		inst.clusterFile = cf
		inst.Prefix = "bench-" + hex.EncodeToString(id[:])
	}
	dir, err := os.MkdirTemp(o.WorkDir, "fdb-etcd-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	inst.Dir = dir
	if IsRaw(name) {
		return inst, nil // the harness runs the client per row, in the keyspace
	}
	deadline := time.Now().Add(o.ReadyTimeout)
	// Replicas start one after the other, so replica 0 takes write
	// ownership (server/forward) and keeps it for the whole run; the
	// report's single-client rows, whose client is on replica 0, thus
	// measure the owner without forwarding.
	for r := 0; r < Replicas(name); r++ {
		p, err := inst.spawn(r, bin)
		if err == nil {
			var tlsCfg *tls.Config
			if inst.ca != nil {
				tlsCfg, err = inst.ClientTLS("bench-ready-probe")
			}
			if err == nil {
				err = p.waitReady(ctx, deadline, o.ReadyTimeout, tlsCfg)
			}
		}
		if err != nil {
			inst.Stop()
			return nil, err
		}
	}
	return inst, nil
}

// spawn starts process r of the instance.
func (i *Instance) spawn(r int, bin string) (*process, error) {
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	curl := "http://127.0.0.1:" + strconv.Itoa(cport)
	if i.ca != nil {
		curl = "https://127.0.0.1:" + strconv.Itoa(cport)
	}
	data := filepath.Join(i.Dir, "data")
	p := &process{
		name:     i.Name,
		endpoint: "127.0.0.1:" + strconv.Itoa(cport),
		logPath:  filepath.Join(i.Dir, "server.log"),
		exited:   make(chan struct{}),
	}
	if Replicas(i.Name) > 1 {
		p.name = fmt.Sprintf("%s/%d", i.Name, r)
		p.logPath = filepath.Join(i.Dir, fmt.Sprintf("server-%d.log", r))
	}
	var args []string
	switch i.Name {
	case Etcd:
		pport, err := FreePort()
		if err != nil {
			return nil, err
		}
		purl := "http://127.0.0.1:" + strconv.Itoa(pport)
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
	case FDBEtcdFDB, FDBEtcdFDB3:
		// Replicas find each other through the keyspace and forward writes
		// to the owner's advertised URL, so each advertises its own.
		args = []string{
			"--name", fmt.Sprintf("bench-%d", r),
			"--listen-client-urls", curl,
			"--advertise-client-urls", curl,
			"--backend", "fdb",
			"--fdb-cluster-file", i.clusterFile,
			"--fdb-prefix", i.Prefix,
		}
	}
	if i.pprof && i.Name != Kine {
		args = append(args, "--enable-pprof")
	}
	if i.ca != nil {
		tlsArgs, err := i.ca.serverFiles(filepath.Join(i.Dir, "tls"))
		if err != nil {
			return nil, err
		}
		args = append(args, tlsArgs...)
	}
	args = append(args, i.args...)
	p.logF, err = os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if i.cpus != "" {
		cmd = exec.Command("taskset", append([]string{"-c", i.cpus, bin}, args...)...)
	}
	cmd.Dir = i.Dir
	if i.Name == Kine {
		cmd.Dir = data
	}
	cmd.Stdout = p.logF
	cmd.Stderr = p.logF
	// Own process group (so a terminal ^C reaches only the harness, which
	// then stops the server cleanly) and killed if the harness dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.logF.Close()
		return nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd = cmd
	i.procs = append(i.procs, p)
	i.Endpoints = append(i.Endpoints, p.endpoint)
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) waitReady(ctx context.Context, deadline time.Time, timeout time.Duration, tlsCfg *tls.Config) error {
	// Wait for the port first: a client dialled too early sits in gRPC's
	// reconnect backoff for a second.
	for attempt := 0; attempt < 10000 && time.Now().Before(deadline); attempt++ {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during startup (%v); log tail:\n%s", p.name, p.waitErr, p.logTail(20))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		c, err := net.DialTimeout("tcp", p.endpoint, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{p.endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         tlsCfg,
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	var last error
	for attempt := 0; attempt < 1000 && time.Now().Before(deadline); attempt++ {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during startup (%v); log tail:\n%s", p.name, p.waitErr, p.logTail(20))
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
	return fmt.Errorf("%s not ready after %s: %v; log tail:\n%s", p.name, timeout, last, p.logTail(20))
}

// ClusterFile is the FoundationDB cluster file of the instance's keyspace;
// "" off FoundationDB.
func (i *Instance) ClusterFile() string { return i.clusterFile }

// PIDs are the server's process ids, one per replica.
func (i *Instance) PIDs() []int {
	out := make([]int, len(i.procs))
	for k, p := range i.procs {
		out[k] = p.cmd.Process.Pid
	}
	return out
}

// Alive reports whether every process is still running.
func (i *Instance) Alive() bool {
	for _, p := range i.procs {
		if !p.alive() {
			return false
		}
	}
	return true
}

func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Stop terminates the processes (SIGTERM, then SIGKILL after 10s), clears
// the FoundationDB keyspace, since a throwaway fdbserver keeps everything in
// memory, and removes the temp dir, unless asked to keep them.
func (i *Instance) Stop() error {
	for _, p := range i.procs {
		if p.alive() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range i.procs {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		p.logF.Close()
	}
	if i.keep {
		return nil
	}
	var errs []error
	if i.Prefix != "" {
		errs = append(errs, clearKeyspace(i.clusterFile, i.Prefix))
	}
	if i.Dir != "" {
		errs = append(errs, os.RemoveAll(i.Dir))
	}
	return errors.Join(errs...)
}

// clearKeyspace deletes the keyspace prefix (storage/fdb.KeyPrefix: 0x02,
// the name, 0x00; the name is hex, so needs no escaping) with fdbcli, which
// saves the harness a cgo dependency.
func clearKeyspace(clusterFile, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "fdbcli", "-C", clusterFile, "--timeout", "30", "--exec",
		fmt.Sprintf(`writemode on; clearrange \x02%s\x00 \x02%s\x01`, prefix, prefix)).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Committed")) {
		return fmt.Errorf("clearing FoundationDB keyspace %s (left in the cluster): %v %s", prefix, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// FDBStatus describes the cluster in clusterFile in one line (version,
// processes, redundancy and storage engine), or says why it cannot.
func FDBStatus(clusterFile string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "fdbcli", "-C", clusterFile, "--timeout", "20", "--exec", "status json").Output()
	if err != nil {
		return "status unknown (fdbcli: " + err.Error() + ")"
	}
	var st struct {
		Cluster struct {
			Configuration struct {
				RedundancyMode string `json:"redundancy_mode"`
				StorageEngine  string `json:"storage_engine"`
			} `json:"configuration"`
			Processes map[string]struct {
				Version string `json:"version"`
			} `json:"processes"`
		} `json:"cluster"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "status unknown (" + err.Error() + ")"
	}
	version := "?"
	for _, p := range st.Cluster.Processes {
		version = p.Version
	}
	procs := fmt.Sprintf("%d processes", len(st.Cluster.Processes))
	if len(st.Cluster.Processes) == 1 {
		procs = "1 process"
	}
	return fmt.Sprintf("FoundationDB %s, %s, %s redundancy, %s storage engine", version, procs,
		st.Cluster.Configuration.RedundancyMode, st.Cluster.Configuration.StorageEngine)
}

// LogTail returns the last n lines of each process's log.
func (i *Instance) LogTail(n int) string {
	if len(i.procs) == 1 {
		return i.procs[0].logTail(n)
	}
	var b strings.Builder
	for _, p := range i.procs {
		fmt.Fprintf(&b, "== %s ==\n%s\n", p.name, p.logTail(n))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func (p *process) logTail(n int) string {
	f, err := os.Open(p.logPath)
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
