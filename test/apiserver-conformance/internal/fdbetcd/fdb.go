package fdbetcd

import (
	"encoding/json"
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
	"time"
)

// EnvFDB selects whether the conformance tests also run fdb-etcd on
// FoundationDB: "1" requires it (make conformance sets it when it found
// FoundationDB), "0" skips it, unset runs it when fdbserver and fdbcli are
// on PATH.
const EnvFDB = "CONFORMANCE_FDB"

// FDBWanted reports whether the FoundationDB half runs, and if not why.
// It fails when EnvFDB=1 and the executables are missing.
func FDBWanted() (bool, string, error) {
	switch os.Getenv(EnvFDB) {
	case "0":
		return false, EnvFDB + "=0", nil
	case "1":
		if m := fdbMissing(); m != "" {
			return false, "", fmt.Errorf("%s=1 but %s", EnvFDB, m)
		}
		return true, "", nil
	}
	if m := fdbMissing(); m != "" {
		return false, m + " (make conformance finds FoundationDB like make test-fdb)", nil
	}
	return true, "", nil
}

func fdbMissing() string {
	for _, bin := range []string{"fdbserver", "fdbcli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not on PATH"
		}
	}
	return ""
}

// FDBOptions describe a throwaway cluster.
type FDBOptions struct {
	// Processes is the number of fdbserver processes (default 1). Up to
	// three of them are coordinators.
	Processes int
	// Configure is the database configuration (default "single memory";
	// "double ssd-2" needs at least two processes).
	Configure string
}

// RecommendedKnobs returns the server knobs every process of a test cluster
// gets: those docs/operations.md recommends for a control plane's cluster
// (the main module's test clusters use the same):
// the commit proxies send a commit on without waiting to batch it with
// others, since fdb-etcd batches its own writes.
func RecommendedKnobs() []string {
	return []string{
		"commit_transaction_batch_interval_from_idle=0.00001",
		"commit_transaction_batch_interval_min=0.00001",
	}
}

// FDB is a throwaway FoundationDB cluster on loopback: fdbserver processes
// with their own data and log directories under one root, each in its own
// zone so that double or triple redundancy can place replicas. Processes
// can be killed and restarted one at a time.
type FDB struct {
	ClusterFile string
	root        string

	mu    sync.Mutex
	procs []*fdbProc
}

type fdbProc struct {
	addr, dir string
	cmd       *exec.Cmd
	done      chan struct{}
}

// StartFDB starts a cluster under root (created if needed) and waits until
// the database is available.
func StartFDB(root string, o FDBOptions) (*FDB, error) {
	if o.Processes <= 0 {
		o.Processes = 1
	}
	if o.Configure == "" {
		o.Configure = "single memory"
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		f, err := tryStartFDB(filepath.Join(root, fmt.Sprintf("fdb-%d", attempt)), o)
		if err == nil {
			return f, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, errors.Join(errs...)
}

func tryStartFDB(root string, o FDBOptions) (*FDB, error) {
	f := &FDB{root: root, ClusterFile: filepath.Join(root, "fdb.cluster")}
	var coords []string
	for i := 0; i < o.Processes; i++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		f.procs = append(f.procs, &fdbProc{addr: addr, dir: filepath.Join(root, fmt.Sprintf("p%d", i))})
		if i < 3 {
			coords = append(coords, addr)
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	desc := "conformance:" + randHex(8) + "@" + strings.Join(coords, ",") + "\n"
	if err := os.WriteFile(f.ClusterFile, []byte(desc), 0o644); err != nil {
		return nil, err
	}
	for i := range f.procs {
		if err := f.startProc(i); err != nil {
			f.Stop()
			return nil, err
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	if err := f.cliUntil(deadline, "configure new "+o.Configure, "Database created", "already exists"); err != nil {
		f.Stop()
		return nil, err
	}
	if err := f.WaitAvailable(deadline); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

func (f *FDB) startProc(i int) error {
	p := f.procs[i]
	for _, sub := range []string{"data", "logs"} {
		if err := os.MkdirAll(filepath.Join(p.dir, sub), 0o755); err != nil {
			return err
		}
	}
	out, err := os.OpenFile(filepath.Join(p.dir, "fdbserver.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("fdbserver", "--public-address", p.addr, "--listen-address", p.addr,
		"--cluster-file", f.ClusterFile, "--datadir", filepath.Join(p.dir, "data"), "--logdir", filepath.Join(p.dir, "logs"),
		"--locality-zoneid", fmt.Sprintf("z%d", i), "--locality-machineid", fmt.Sprintf("m%d", i))
	for _, k := range RecommendedKnobs() {
		cmd.Args = append(cmd.Args, "--knob_"+k)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return nil
}

// CLI runs fdbcli --exec command once and returns its output.
func (f *FDB) CLI(command string) (string, error) {
	out, err := exec.Command("fdbcli", "--cluster-file", f.ClusterFile, "--timeout", "10", "--exec", command).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// cliUntil runs command until its output contains one of want.
func (f *FDB) cliUntil(deadline time.Time, command string, want ...string) error {
	var last string
	for time.Now().Before(deadline) {
		last, _ = f.CLI(command)
		for _, w := range want {
			if strings.Contains(last, w) {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("fdbcli --exec %q: none of %q before the deadline; last output: %s (files in %s)", command, want, last, f.root)
}

// WaitAvailable waits until the database answers as available.
func (f *FDB) WaitAvailable(deadline time.Time) error {
	return f.cliUntil(deadline, "status minimal", "The database is available")
}

// Processes is the number of fdbserver processes.
func (f *FDB) Processes() int { return len(f.procs) }

// Kill stops process i at once (SIGKILL); Restart starts it again on the
// same address and data.
func (f *FDB) Kill(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.procs[i]
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// Restart starts a killed process i again.
func (f *FDB) Restart(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.procs[i].cmd != nil {
		return fmt.Errorf("fdbserver %d is running", i)
	}
	return f.startProc(i)
}

// Stop ends every process. The files stay under the root the caller gave.
func (f *FDB) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.cmd == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		p.cmd = nil
	}
}

// Index returns the index of the process at addr (host:port), or -1.
func (f *FDB) Index(addr string) int {
	for i, p := range f.procs {
		if p.addr == addr {
			return i
		}
	}
	return -1
}

// Health is the part of `status json` the fault scenarios wait on.
type Health struct {
	// Healthy: fully recovered and every shard at full replication.
	Healthy bool
	// Roles maps a role (master, cluster_controller, log, storage, ...) to
	// the indices of the processes holding it.
	Roles map[string][]int
}

type statusJSON struct {
	Cluster struct {
		RecoveryState struct {
			Name string `json:"name"`
		} `json:"recovery_state"`
		Data struct {
			State struct {
				Healthy bool `json:"healthy"`
			} `json:"state"`
		} `json:"data"`
		Processes map[string]struct {
			Address string `json:"address"`
			Roles   []struct {
				Role string `json:"role"`
			} `json:"roles"`
		} `json:"processes"`
	} `json:"cluster"`
}

// Status reads `status json`; while the cluster cannot answer, it reports
// an unhealthy cluster with no roles.
func (f *FDB) Status() Health {
	h := Health{Roles: map[string][]int{}}
	out, _ := f.CLI("status json")
	start := strings.IndexByte(out, '{')
	if start < 0 {
		return h
	}
	var raw statusJSON
	if json.Unmarshal([]byte(out[start:]), &raw) != nil {
		return h
	}
	h.Healthy = raw.Cluster.RecoveryState.Name == "fully_recovered" && raw.Cluster.Data.State.Healthy
	for _, p := range raw.Cluster.Processes {
		if i := f.Index(p.Address); i >= 0 {
			for _, r := range p.Roles {
				h.Roles[r.Role] = append(h.Roles[r.Role], i)
			}
		}
	}
	return h
}

// WaitHealthy waits until the cluster is fully recovered and its data fully
// replicated, so that the next fault meets a whole cluster.
func (f *FDB) WaitHealthy(deadline time.Time) error {
	for time.Now().Before(deadline) {
		if f.Status().Healthy {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("FoundationDB not healthy before the deadline (files in %s)", f.root)
}

// rebootExitWait is how long a process asked to reboot has to exit.
const rebootExitWait = 15 * time.Second

// ForceRecovery reboots every process through `fdbcli kill; kill all`, as
// an operator forces a recovery, and starts each again as soon as it has
// exited (fdbmonitor's job in production). Commits in flight may answer
// commit_unknown_result; commits wait until the recovery ends.
func (f *FDB) ForceRecovery() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	addrs := make([]string, len(f.procs))
	for i, p := range f.procs {
		if p.cmd == nil {
			return fmt.Errorf("fdbserver %d is not running", i)
		}
		addrs[i] = p.addr
	}
	// fdbcli sends the reboot requests without waiting for them, so it
	// stays a moment; it may then linger with its cluster gone, so the
	// processes are restarted while it runs.
	cli := make(chan string, 1)
	go func() {
		out, _ := f.CLI("kill; kill " + strings.Join(addrs, " ") + "; sleep 1")
		cli <- out
	}()
	var errs []error
	for i, p := range f.procs {
		select {
		case <-p.done:
		case <-time.After(rebootExitWait):
			errs = append(errs, fmt.Errorf("fdbserver %d did not exit after fdbcli kill", i))
			continue
		}
		p.cmd = nil
		errs = append(errs, f.startProc(i))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (fdbcli: %s)", err, <-cli)
	}
	<-cli
	return nil
}
