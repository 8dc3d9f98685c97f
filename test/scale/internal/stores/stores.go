// Package stores starts the storage servers a scale run compares, each on
// loopback ports and fresh data: etcd (the version Kubernetes pins), fdb-etcd
// on its embedded Pebble store, and three fdb-etcd replicas on one
// FoundationDB keyspace.
package stores

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/proc"
)

// Kinds of store, in the order a run measures them.
const (
	Etcd   = "etcd"
	Pebble = "pebble"
	FDB    = "fdb"
)

// Kinds lists every store kind.
var Kinds = []string{Etcd, Pebble, FDB}

// Title is how reports name a store kind.
func Title(kind string) string {
	switch kind {
	case Etcd:
		return "etcd"
	case Pebble:
		return "fdb-etcd (Pebble)"
	case FDB:
		return "fdb-etcd (FoundationDB, 3 replicas)"
	}
	return kind
}

// Binaries are the executables the stores run.
type Binaries struct {
	Etcd       string // etcd server
	FDBEtcd    string // fdb-etcd built without the fdb tag (Pebble)
	FDBEtcdFDB string // fdb-etcd built with -tags fdb
}

// Options configure a store.
type Options struct {
	Dir         string // data and logs go below it
	ClusterFile string // FoundationDB cluster file (FDB only)
	// ProgressNotify is --watch-progress-notify-interval, as kubeadm sets
	// it for etcd (5 s), the same for every store.
	ProgressNotify time.Duration
	ReadyTimeout   time.Duration
}

// Store is a running storage server: one process, or three replicas.
type Store struct {
	Kind       string
	ClientURLs []string
	// MetricsURLs serve each process's Prometheus /metrics (etcd on its
	// client port, fdb-etcd on --listen-metrics-urls).
	MetricsURLs []string
	Procs       []*proc.Proc
	// Backing are processes the store depends on but did not start (the
	// fdbserver): their usage is reported beside the store's own.
	Backing     []int
	clusterFile string
	prefix      string
}

// Start starts a store of the given kind.
func Start(ctx context.Context, kind string, bins Binaries, o Options) (*Store, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	s := &Store{Kind: kind}
	var err error
	switch kind {
	case Etcd:
		err = s.spawnEtcd(ctx, bins.Etcd, o)
	case Pebble:
		err = s.spawnFDBEtcd(ctx, bins.FDBEtcd, 0, o, "--data-dir", filepath.Join(o.Dir, "data"))
	case FDB:
		err = s.startReplicas(ctx, bins.FDBEtcdFDB, o)
	default:
		err = fmt.Errorf("unknown store %q (known: %s)", kind, strings.Join(Kinds, ", "))
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Store) startReplicas(ctx context.Context, bin string, o Options) error {
	if o.ClusterFile == "" {
		return errors.New("fdb needs a FoundationDB cluster file (FDB_CLUSTER_FILE; make scale starts a throwaway fdbserver)")
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s.clusterFile, s.prefix = o.ClusterFile, "scale-"+hex.EncodeToString(id[:])
	if pid, err := proc.FindByArg("fdbserver", o.ClusterFile); err == nil {
		s.Backing = append(s.Backing, pid)
	}
	// One after the other, so replica 0 takes write ownership first.
	for r := 0; r < 3; r++ {
		err := s.spawnFDBEtcd(ctx, bin, r, o, "--backend", "fdb", "--fdb-cluster-file", o.ClusterFile, "--fdb-prefix", s.prefix)
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) spawnEtcd(ctx context.Context, bin string, o Options) error {
	cport, err1 := proc.FreePort()
	pport, err2 := proc.FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	curl := "http://127.0.0.1:" + strconv.Itoa(cport)
	purl := "http://127.0.0.1:" + strconv.Itoa(pport)
	args := []string{
		"--name", "scale",
		"--data-dir", filepath.Join(o.Dir, "data"),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "scale=" + purl, "--initial-cluster-state", "new",
		// 8 GiB, as large clusters configure it (the default 2 GiB can fill
		// during a long run with the compaction every 5 min).
		"--quota-backend-bytes", strconv.FormatInt(8<<30, 10),
		"--watch-progress-notify-interval", o.ProgressNotify.String(),
		"--enable-pprof",
		"--log-level", "warn",
	}
	s.MetricsURLs = append(s.MetricsURLs, curl+"/metrics")
	return s.spawn(ctx, "etcd", bin, args, curl, o)
}

func (s *Store) spawnFDBEtcd(ctx context.Context, bin string, replica int, o Options, extra ...string) error {
	port, err1 := proc.FreePort()
	mport, err2 := proc.FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	curl := "http://127.0.0.1:" + strconv.Itoa(port)
	murl := "http://127.0.0.1:" + strconv.Itoa(mport)
	s.MetricsURLs = append(s.MetricsURLs, murl+"/metrics")
	args := append([]string{
		"--name", "scale-" + strconv.Itoa(replica),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-metrics-urls", murl,
		"--watch-progress-notify-interval", o.ProgressNotify.String(),
		"--enable-pprof",
		"--log-level", "warn", "--log-format", "console",
	}, extra...)
	return s.spawn(ctx, "fdb-etcd-"+strconv.Itoa(replica), bin, args, curl, o)
}

func (s *Store) spawn(ctx context.Context, name, bin string, args []string, url string, o Options) error {
	p, err := proc.Start(name, bin, args, nil, filepath.Join(o.Dir, name+".log"))
	if err != nil {
		return err
	}
	s.Procs = append(s.Procs, p)
	s.ClientURLs = append(s.ClientURLs, url)
	return waitHealthy(ctx, p, url, o.ReadyTimeout)
}

// waitHealthy polls /health on the client port (etcd and fdb-etcd both
// answer it with a linearizable read) until it says true.
func waitHealthy(ctx context.Context, p *proc.Proc, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited during start-up (%v):\n%s", p.Name, err, p.LogTail(30))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"true"`)) {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %v (last: %s):\n%s", p.Name, timeout, last, p.LogTail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PIDs are the store's own processes.
func (s *Store) PIDs() []int { return proc.PIDs(s.Procs) }

// Alive says which process, if any, has exited.
func (s *Store) Alive() error {
	for _, p := range s.Procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited (%v):\n%s", p.Name, err, p.LogTail(30))
		}
	}
	return nil
}

// Stop stops the processes and clears the FoundationDB keyspace, which the
// throwaway fdbserver would otherwise keep in memory for the next store.
func (s *Store) Stop() error {
	for _, p := range s.Procs {
		p.Stop()
	}
	if s.prefix == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// storage/fdb's keyspace prefix is 0x02, the name, 0x00; the name is
	// hex, so it needs no escaping.
	out, err := exec.CommandContext(ctx, "fdbcli", "-C", s.clusterFile, "--timeout", "30", "--exec",
		fmt.Sprintf(`writemode on; clearrange \x02%s\x00 \x02%s\x01`, s.prefix, s.prefix)).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Committed")) {
		return fmt.Errorf("clearing FoundationDB keyspace %s: %v %s", s.prefix, err, bytes.TrimSpace(out))
	}
	return nil
}
