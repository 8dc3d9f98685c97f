// Package fdbserver starts and stops throwaway FoundationDB clusters on
// loopback, for tests: the single-process `single memory` cluster the fast
// suites share, and clusters of several processes with real redundancy
// (double, triple) and durable storage engines (ssd-2, ssd-redwood-1) whose
// processes a test can kill, pause, restart, exclude or reboot to force
// recoveries, as FoundationDB fails in production.
//
// It only runs the fdbserver and fdbcli executables, so it needs neither cgo
// nor libfdb_c, and test modules that drive a prebuilt fdb-etcd binary can
// use it too. The executables come from $FDB_HOME/bin when FDB_HOME is set,
// else from PATH (Config.BinDir overrides both).
package fdbserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/freeport"
)

// startTimeout bounds starting, configuring and waiting for one attempt.
const startTimeout = 3 * time.Minute

// Config describes a cluster. The zero value is the fast suites' cluster:
// one process, `single memory`.
type Config struct {
	// Processes is the number of fdbserver processes (default 1). Each has
	// its own loopback port, data and log directories, and zone and machine
	// id, so that double and triple redundancy can place replicas.
	Processes int
	// Redundancy is single (default), double or triple.
	Redundancy string
	// Storage is the storage engine: memory (default), ssd-2 or
	// ssd-redwood-1.
	Storage string
	// StorageMemory is each process's --storage-memory (the memory
	// engine's capacity, default 1GiB): a benchmark that writes faster
	// than the suites fills the default, and ratekeeper then stops writes.
	StorageMemory string
	// Coordinators is how many processes (the first ones) coordinate;
	// default 3, or 1 when there are fewer than 3 processes.
	Coordinators int
	// Classes are the processes' classes (storage, transaction, stateless,
	// ...), by index; missing or "" leaves a process unset.
	Classes []string
	// Knobs are server knobs, name=value, given to every process
	// (--knob_name=value); nil means DefaultKnobs().
	Knobs []string
	// BinDir holds fdbserver and fdbcli; "" means $FDB_HOME/bin when
	// FDB_HOME is set, else PATH.
	BinDir string
}

func (c Config) withDefaults() Config {
	if c.Processes <= 0 {
		c.Processes = 1
	}
	if c.Redundancy == "" {
		c.Redundancy = "single"
	}
	if c.Storage == "" {
		c.Storage = "memory"
	}
	if c.Coordinators <= 0 {
		c.Coordinators = 3
	}
	c.Coordinators = min(c.Coordinators, c.Processes)
	if c.Knobs == nil {
		c.Knobs = DefaultKnobs()
	}
	if c.BinDir == "" {
		if home := os.Getenv("FDB_HOME"); home != "" {
			c.BinDir = filepath.Join(home, "bin")
		}
	}
	return c
}

// DefaultKnobs are the server knobs of a test cluster:
//   - data distribution starts reacting to failures 5 s after a process
//     starts instead of 30 s, so a new cluster reports its data healthy
//     about 25 s sooner (a whole-cluster restart has its processes back
//     well within 5 s);
//   - the commit proxies send a commit on without waiting to batch it
//     with others (0.5 ms when idle, at least 1 ms after a batch, by
//     default). fdb-etcd batches its own writes (one group commit in
//     flight per writer), so that wait only adds latency; these are the
//     settings docs/operations.md recommends for a control plane's
//     cluster, so the tests and the benchmark run on them.
func DefaultKnobs() []string {
	return []string{
		"initial_failure_reaction_delay=5",
		"commit_transaction_batch_interval_from_idle=0.00001",
		"commit_transaction_batch_interval_min=0.00001",
	}
}

// binaries returns the paths of fdbserver and fdbcli.
func (c Config) binaries() (server, cli string, err error) {
	find := func(name string) (string, error) {
		if c.BinDir != "" {
			p := filepath.Join(c.BinDir, name)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%s not found in %s", name, c.BinDir)
			}
			return p, nil
		}
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%s not found on PATH", name)
		}
		return p, nil
	}
	if server, err = find("fdbserver"); err != nil {
		return "", "", err
	}
	if cli, err = find("fdbcli"); err != nil {
		return "", "", err
	}
	return server, cli, nil
}

// Missing returns which of the executables a cluster needs cannot be found
// ($FDB_HOME/bin when FDB_HOME is set, else PATH), or "".
func Missing() string {
	if _, _, err := (Config{}).withDefaults().binaries(); err != nil {
		return err.Error()
	}
	return ""
}

// Cluster is a running throwaway FoundationDB cluster.
type Cluster struct {
	cfg         Config
	root        string // the cluster's files: cluster file, one directory per process
	clusterFile string
	serverBin   string
	cliBin      string
	procs       []*process
}

// Start starts the fast suites' cluster: one process, `single memory`.
func Start() (*Cluster, error) { return StartCluster(Config{}) }

// StartCluster starts cfg.Processes processes in a new temporary directory,
// configures the database and waits until it is available and, with more
// than one process, healthy (fully recovered, data fully replicated). Ports taken between choosing and
// binding them cost another attempt, not a failure.
func StartCluster(cfg Config) (*Cluster, error) {
	cfg = cfg.withDefaults()
	server, cli, err := cfg.binaries()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "fdbserver-")
	if err != nil {
		return nil, err
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		c := &Cluster{cfg: cfg, root: filepath.Join(root, strconv.Itoa(attempt)), serverBin: server, cliBin: cli}
		err := c.start()
		if err == nil {
			return c, nil
		}
		c.killAll()
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("%w (logs in %s)", errors.Join(errs...), root)
}

func (c *Cluster) start() error {
	addrs, err := freeport.Addrs(c.cfg.Processes)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.root, 0o755); err != nil {
		return err
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	c.clusterFile = filepath.Join(c.root, "fdb.cluster")
	coords := strings.Join(addrs[:c.cfg.Coordinators], ",")
	if err := os.WriteFile(c.clusterFile, []byte("fdbtest:"+hex.EncodeToString(id[:])+"@"+coords+"\n"), 0o644); err != nil {
		return err
	}
	for i, addr := range addrs {
		p, err := c.newProcess(i, addr)
		if err != nil {
			return err
		}
		c.procs = append(c.procs, p)
		if err := p.start(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	configure := "configure new " + c.cfg.Redundancy + " " + c.cfg.Storage
	if err := c.cliUntil(ctx, configure, "Database created", "already exists"); err != nil {
		return fmt.Errorf("%s: %w", configure, err)
	}
	if len(c.procs) == 1 {
		// Nothing to replicate: the fast suites' cluster is ready once it
		// answers.
		if err := c.WaitAvailable(ctx); err != nil {
			return fmt.Errorf("wait until available: %w", err)
		}
		return nil
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return fmt.Errorf("wait until healthy: %w", err)
	}
	return nil
}

func (c *Cluster) newProcess(i int, addr string) (*process, error) {
	dir := filepath.Join(c.root, fmt.Sprintf("p%d", i))
	for _, sub := range []string{"data", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	args := []string{
		"--public-address", addr, "--listen-address", addr,
		"--cluster-file", c.clusterFile,
		"--datadir", filepath.Join(dir, "data"),
		"--logdir", filepath.Join(dir, "logs"),
		// Distinct localities: double and triple redundancy place replicas
		// on distinct zones, and could not recover on one "machine".
		"--locality-zoneid", fmt.Sprintf("z%d", i),
		"--locality-machineid", fmt.Sprintf("m%d", i),
	}
	for _, k := range c.cfg.Knobs {
		args = append(args, "--knob_"+k)
	}
	if c.cfg.StorageMemory != "" {
		args = append(args, "--storage-memory", c.cfg.StorageMemory)
	}
	if i < len(c.cfg.Classes) && c.cfg.Classes[i] != "" {
		args = append(args, "--class", c.cfg.Classes[i])
	}
	return &process{index: i, addr: addr, bin: c.serverBin, args: args, out: filepath.Join(dir, "fdbserver.out")}, nil
}

// ClusterFile is the path of the cluster's cluster file.
func (c *Cluster) ClusterFile() string { return c.clusterFile }

// Size is the number of processes.
func (c *Cluster) Size() int { return len(c.procs) }

// Addr is process i's address (127.0.0.1:port), as status json names it.
func (c *Cluster) Addr(i int) string { return c.procs[i].addr }

// Stop ends every process and removes the cluster's files, unless keep
// (tests failed: the trace logs may tell why), in which case it says where
// they are.
func (c *Cluster) Stop(keep bool) {
	var wg sync.WaitGroup
	for _, p := range c.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.terminate(10 * time.Second)
		}()
	}
	wg.Wait()
	if keep {
		fmt.Fprintf(os.Stderr, "fdbserver: files kept in %s\n", filepath.Dir(c.root))
		return
	}
	_ = os.RemoveAll(filepath.Dir(c.root))
}

func (c *Cluster) killAll() {
	for _, p := range c.procs {
		_ = p.kill()
	}
}
