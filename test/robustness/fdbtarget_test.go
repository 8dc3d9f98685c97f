package robustness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/tests/v3/robustness/model"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
)

// The FoundationDB scenarios run fdb-etcd as it runs in production: three
// replicas sharing one keyspace on a replicated cluster of five fdbserver
// processes (double redundancy, ssd-2, three coordinators, process
// classes), with write forwarding on, and put that cluster through
// FoundationDB's own failures.

// clusterClasses lay the cluster out as production does, one role family
// per process, so that each fault hits what it names: process 0 holds the
// stateless roles (cluster controller, master, proxies, resolver), 1 and 2
// the transaction logs, 3 and 4 the storage servers; 0-2 coordinate.
var clusterClasses = []string{"stateless", "transaction", "transaction", "storage", "storage"}

// fdbBin is fdb-etcd built with -tags fdb (cgo, libfdb_c), once per test
// binary, or ROBUSTNESS_FDB_BINARY.
var fdbBin struct {
	once sync.Once
	path string
	err  error
}

// fdbUnavailable says why the FoundationDB scenarios cannot run here, or "".
func fdbUnavailable() string {
	if m := fdbserver.Missing(); m != "" {
		return m
	}
	fdbBin.once.Do(func() {
		if b := os.Getenv("ROBUSTNESS_FDB_BINARY"); b != "" {
			fdbBin.path = b
			return
		}
		fdbBin.path = filepath.Join(binDir, "fdb-etcd-fdb")
		build := exec.Command("go", "build", "-tags", "fdb,fdbetcd_testhooks", "-o", fdbBin.path, "./cmd/fdb-etcd")
		build.Dir = "../.."
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			fdbBin.err = fmt.Errorf("building fdb-etcd with -tags fdb (needs cgo and libfdb_c: make sets them up): %v\n%s", err, out)
		}
	})
	if fdbBin.err != nil {
		return fdbBin.err.Error()
	}
	return ""
}

// requireFDB skips t without FoundationDB, or fails it when
// FDB_TESTS_REQUIRED is set (make robustness runs with it when FoundationDB
// is found).
func requireFDB(t *testing.T) string {
	t.Helper()
	if reason := fdbUnavailable(); reason != "" {
		if os.Getenv("FDB_TESTS_REQUIRED") != "" {
			t.Fatalf("FoundationDB scenarios cannot run: %s", reason)
		}
		t.Skipf("skipping FoundationDB scenarios: %s", reason)
	}
	return fdbBin.path
}

// fdbTarget is the replicas under test, the replicas of a second keyspace
// that only the lease probe uses, the cluster they share, and what watches
// them: readiness and their metrics.
type fdbTarget struct {
	t        *testing.T
	bin      string
	cluster  *fdbserver.Cluster
	prefix   string // the traffic's keyspace; the lease probe's is prefix+"/leases"
	replicas []*server
	leases   []*server
	monitor  *monitor
	probe    *leaseProbe
	// probed is what the lease probe found; stop sets it.
	probed probeResult

	mu       sync.Mutex
	timeline []event // guarded by mu
}

// event is one moment of a fault's timeline.
type event struct {
	at   time.Time
	what string
}

// Timeline events the checks look for.
const (
	evFault        = "fault injected"
	evHealed       = "fault healed"
	evFDBAvailable = "FoundationDB available"
)

// startFDBTarget starts the cluster and the replicas. Replica flags are the
// embedded server's (journal, progress notifications) plus the backend's and
// extra.
func startFDBTarget(t *testing.T, bin string, extra ...string) *fdbTarget {
	t.Helper()
	c, err := fdbserver.StartCluster(fdbserver.Config{Processes: 5, Redundancy: "double", Storage: "ssd-2", Classes: clusterClasses})
	if err != nil {
		t.Fatalf("start FoundationDB: %v", err)
	}
	f := &fdbTarget{t: t, bin: bin, cluster: c, prefix: "robustness/" + randomHex()}
	t.Cleanup(func() {
		for _, s := range append(f.replicas, f.leases...) {
			s.kill9()
		}
		c.Stop(t.Failed())
	})
	for i := range 3 {
		f.replicas = append(f.replicas, f.startReplica(fmt.Sprintf("r%d", i), f.prefix, extra...))
	}
	for i := range 2 {
		f.leases = append(f.leases, f.startReplica(fmt.Sprintf("lease%d", i), f.prefix+"/leases", extra...))
	}
	f.monitor = startMonitor(append(append([]*server{}, f.replicas...), f.leases...))
	t.Cleanup(f.monitor.close)
	var lepts []string
	for _, s := range f.leases {
		lepts = append(lepts, s.endpoint())
	}
	if f.probe, err = startLeaseProbe(lepts); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fdbTarget) startReplica(name, prefix string, extra ...string) *server {
	args := append([]string{"--name", name, "--backend", "fdb",
		"--fdb-cluster-file", f.cluster.ClusterFile(), "--fdb-prefix", prefix}, extra...)
	return startServerBin(f.t, f.bin, args...)
}

// note adds an event to the fault timeline.
func (f *fdbTarget) note(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timeline = append(f.timeline, event{time.Now(), what})
}

func (f *fdbTarget) events() []event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]event(nil), f.timeline...)
}

// waitAvailable notes when FoundationDB answers again after a fault.
func (f *fdbTarget) waitAvailable(ctx context.Context) error {
	if err := f.cluster.WaitAvailable(ctx); err != nil {
		return err
	}
	f.note(evFDBAvailable)
	return nil
}

// killReplica kills s with SIGKILL, keeping the metrics it had counted.
func (f *fdbTarget) killReplica(s *server) {
	f.monitor.scrapeFinal(s)
	s.kill9()
}

func (f *fdbTarget) endpoints() []string {
	var out []string
	for _, s := range f.replicas {
		out = append(out, s.endpoint())
	}
	return out
}

// probeExpiryWait bounds how long stop waits for the lease probe's last
// leases to expire: expiry may have to change hands first.
const probeExpiryWait = 30 * time.Second

// stop lets the lease probe's leases expire and checks them, then stops the
// replicas gracefully, scraping each one's metrics first.
func (f *fdbTarget) stop() {
	f.probed = f.probe.finish(probeExpiryWait)
	f.monitor.close()
	for _, s := range append(append([]*server{}, f.replicas...), f.leases...) {
		if s.alive() {
			f.monitor.scrapeFinal(s)
		}
		s.stop()
	}
}

func (f *fdbTarget) exportPersisted() ([]model.EtcdRequest, error) {
	out, err := f.export(f.prefix)
	if err != nil {
		return nil, err
	}
	return toModelRequests(out)
}

// export runs experimental-export-persisted on a keyspace of the cluster.
func (f *fdbTarget) export(prefix string) ([]byte, error) {
	cmd := exec.Command(f.bin, "experimental-export-persisted", "--backend", "fdb",
		"--fdb-cluster-file", f.cluster.ClusterFile(), "--fdb-prefix", prefix)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("experimental-export-persisted %s: %v: %s", prefix, err, errb.String())
	}
	return out.Bytes(), nil
}

// faultCounts are FoundationDB's client counters over every replica
// lifetime: retries by error code and recoveries seen.
func (f *fdbTarget) faultCounts() map[string]int64 { return f.monitor.totals() }

func (f *fdbTarget) reportFiles() (dataDirs, logs map[string]string) {
	logs = map[string]string{}
	for _, s := range append(append([]*server{}, f.replicas...), f.leases...) {
		logs[s.name()+".log"] = s.logPath
	}
	return map[string]string{}, logs
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// monitor polls every replica's /readyz and keeps the metrics it scrapes
// from them before they are killed or stopped.
type monitor struct {
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	mu      sync.Mutex
	samples map[*server][]readiness // guarded by mu: readiness changes
	counts  map[string]int64        // guarded by mu: scraped counters, summed over lifetimes
}

// readiness is a replica's /readyz answer changing at a moment.
type readiness struct {
	at    time.Time
	ready bool
}

const (
	readyPoll    = 250 * time.Millisecond
	readyTimeout = 2 * time.Second // slower than this is not ready (a kubelet probe gives up after 1 s)
)

func startMonitor(servers []*server) *monitor {
	m := &monitor{stop: make(chan struct{}), samples: map[*server][]readiness{}, counts: map[string]int64{}}
	for _, s := range servers {
		m.wg.Add(1)
		go m.pollReady(s)
	}
	return m
}

func (m *monitor) close() {
	m.once.Do(func() { close(m.stop) })
	m.wg.Wait()
}

func (m *monitor) pollReady(s *server) {
	defer m.wg.Done()
	client := &http.Client{Timeout: readyTimeout}
	for {
		ready := false
		if resp, err := client.Get("http://" + s.endpoint() + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ready = resp.StatusCode == http.StatusOK
		}
		m.mu.Lock()
		h := m.samples[s]
		if len(h) == 0 || h[len(h)-1].ready != ready {
			m.samples[s] = append(h, readiness{time.Now(), ready})
		}
		m.mu.Unlock()
		select {
		case <-m.stop:
			return
		case <-time.After(readyPoll):
		}
	}
}

// history returns s's readiness changes.
func (m *monitor) history(s *server) []readiness {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]readiness(nil), m.samples[s]...)
}

var counterLine = regexp.MustCompile(`(?m)^(fdb_etcd_fdb_transaction_retries_total|fdb_etcd_fdb_recoveries_seen_total|grpc_server_handled_total)(\{[^}]*\})? ([0-9.e+]+)$`)

// scrapeFinal adds s's counters to the totals; it is called once per
// process lifetime, right before the process ends.
func (m *monitor) scrapeFinal(s *server) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + s.endpoint() + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	m.mu.Lock()
	defer m.mu.Unlock()
	for sc.Scan() {
		g := counterLine.FindStringSubmatch(sc.Text())
		if g == nil {
			continue
		}
		v, _ := strconv.ParseFloat(g[3], 64)
		if key := counterKey(g[1], g[2]); key != "" && v > 0 {
			m.counts[key] += int64(v)
		}
	}
}

var labelValue = regexp.MustCompile(`(\w+)="([^"]*)"`)

// counterKey names a scraped counter in the summary: fdb-retry-1021,
// fdb-recoveries, grpc-Unavailable (gRPC codes other than OK only).
func counterKey(name, labels string) string {
	l := map[string]string{}
	for _, kv := range labelValue.FindAllStringSubmatch(labels, -1) {
		l[kv[1]] = kv[2]
	}
	switch name {
	case "fdb_etcd_fdb_transaction_retries_total":
		return "fdb-retry-" + l["code"]
	case "fdb_etcd_fdb_recoveries_seen_total":
		return "fdb-recoveries"
	case "grpc_server_handled_total":
		// Streams end with Canceled when clients go; unary calls say
		// what clients were told.
		if c := l["grpc_code"]; c != "OK" && l["grpc_type"] == "unary" {
			return "grpc-" + c
		}
	}
	return ""
}

func (m *monitor) totals() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int64{}
	for k, v := range m.counts {
		out[k] = v
	}
	return out
}
