package scenarios

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// envFDBFaults runs TestFDBFaults (make conformance-fdb-faults): it takes
// several minutes, most of them FoundationDB re-replicating after a fault,
// so `make conformance` leaves it out.
const envFDBFaults = "CONFORMANCE_FDB_FAULTS"

var flagFaults = flag.String("faults", "all", "TestFDBFaults: the faults to inject, by number in faults() (e.g. 1,3), or all")

const (
	faultProcesses = 5
	faultConfigure = "double ssd-2"
	faultSteady    = 10 * time.Second // the workload runs this long before and after each fault
	faultDown      = 5 * time.Second  // a killed process stays down this long
	faultHealthy   = 4 * time.Minute  // FoundationDB must be whole again within this
)

// faultStack is kube-apiserver on three fdb-etcd replicas on a
// multi-process FoundationDB cluster of its own.
type faultStack struct {
	fdb  *fdbetcd.FDB
	reps *fdbetcd.Replicas
	c    *cluster
}

// fault is one injected failure; inject returns once the failed part has
// been started again.
type fault struct {
	name   string
	inject func(t *testing.T, fs *faultStack) string // what it did
}

// faultPhase is one fault's window in the run.
type faultPhase struct {
	name, did  string
	start, end time.Time
}

// TestFDBFaults runs a client-go workload (creates, updates, consistent
// LISTs, a watch and an informer) through kube-apiserver on three fdb-etcd
// replicas on a five-process `double ssd-2` FoundationDB cluster while
// FoundationDB and fdb-etcd fail: a storage process killed, the replica
// that owns writes killed, a forced recovery. Afterwards every
// acknowledged write must have reached the watch with its resourceVersion
// and the final state, resourceVersions never go back, and no watcher had
// to relist; the longest time without a successful write is reported per
// fault.
func TestFDBFaults(t *testing.T) {
	if os.Getenv(envFDBFaults) != "1" {
		t.Skipf("%s=1 runs it (make conformance-fdb-faults)", envFDBFaults)
	}
	if fdbCluster == nil {
		t.Fatal("FoundationDB is not available (CONFORMANCE_FDB=1 and fdbserver, fdbcli on PATH)")
	}
	fs := startFaultStack(t)
	ensureNamespace(t, fs.c, faultNS)
	w := startWorkload(t, fs.c)
	var phases []faultPhase
	time.Sleep(faultSteady)
	for i, f := range faults() {
		if *flagFaults != "all" && !slices.Contains(strings.Split(*flagFaults, ","), strconv.Itoa(i+1)) {
			continue
		}
		p := faultPhase{name: f.name, start: time.Now()}
		p.did = f.inject(t, fs)
		must(t, fs.fdb.WaitHealthy(time.Now().Add(faultHealthy)), "FoundationDB after %s", f.name)
		must(t, w.waitWrite(p.start, time.Minute), "a write after %s", f.name)
		time.Sleep(faultSteady)
		p.end = time.Now()
		phases = append(phases, p)
		t.Logf("%s: %s; longest without a successful write %v", f.name, p.did, w.longestGap(p.start, p.end).Round(time.Millisecond))
	}
	w.stop()
	if fs.c.apiserver.exited() {
		t.Fatalf("kube-apiserver exited: %v", fs.c.apiserver.err)
	}
	w.verify(t, fs.c, func(rv string) { fs.diagnose(t, rv) })
	fs.checkCache(t)
	recordFaults(w, phases)
}

func faults() []fault {
	return []fault{
		{"fdbserver storage process killed", killStorage},
		{"fdb-etcd replica owning writes killed", killOwner},
		{"FoundationDB recovery forced", func(t *testing.T, fs *faultStack) string {
			must(t, fs.fdb.ForceRecovery(), "fdbcli kill; kill all")
			return "fdbcli kill; kill all (every process rebooted)"
		}},
	}
}

// killStorage kills -9 a process with a storage role and none of the
// cluster controller's or master's, and restarts it after faultDown.
func killStorage(t *testing.T, fs *faultStack) string {
	h := fs.fdb.Status()
	busy := map[int]bool{}
	for _, r := range []string{"cluster_controller", "master"} {
		for _, i := range h.Roles[r] {
			busy[i] = true
		}
	}
	victim := -1
	for _, i := range h.Roles["storage"] {
		if !busy[i] {
			victim = i
			break
		}
	}
	if victim < 0 {
		t.Fatalf("no storage process without cluster controller or master: %v", h.Roles)
	}
	var roles []string
	for r, is := range h.Roles {
		for _, i := range is {
			if i == victim {
				roles = append(roles, r)
			}
		}
	}
	fs.fdb.Kill(victim)
	time.Sleep(faultDown)
	must(t, fs.fdb.Restart(victim), "restart fdbserver %d", victim)
	return fmt.Sprintf("kill -9 fdbserver %d (roles %s), restarted after %v", victim, strings.Join(roles, ","), faultDown)
}

// killOwner kills -9 the replica that owns writes (the one whose
// fdb_etcd_lease_expiry_owner is 1) and restarts it after faultDown.
func killOwner(t *testing.T, fs *faultStack) string {
	owner := -1
	for i, s := range fs.reps.Servers {
		if strings.Contains(scrape(s.URL+"/metrics"), "\nfdb_etcd_lease_expiry_owner 1") {
			owner = i
		}
	}
	if owner < 0 {
		t.Fatal("no replica reports fdb_etcd_lease_expiry_owner 1")
	}
	fs.reps.Kill(owner)
	time.Sleep(faultDown)
	must(t, fs.reps.Restart1(owner), "restart replica %d", owner)
	return fmt.Sprintf("kill -9 replica %d of 3 (the owner), restarted after %v", owner, faultDown)
}

func scrape(url string) string {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// startFaultStack starts the cluster, the replicas and kube-apiserver; all
// stop when t ends.
func startFaultStack(t *testing.T) *faultStack {
	dir, err := os.MkdirTemp("", "conformance-faults-")
	must(t, err, "temp dir")
	fdb, err := fdbetcd.StartFDB(filepath.Join(dir, "fdb"), fdbetcd.FDBOptions{Processes: faultProcesses, Configure: faultConfigure})
	must(t, err, "starting FoundationDB (%d processes, %s)", faultProcesses, faultConfigure)
	t.Cleanup(fdb.Stop)
	must(t, fdb.WaitHealthy(time.Now().Add(faultHealthy)), "new FoundationDB cluster")
	opts := fdbetcd.Options{ProgressNotifyInterval: progressNotifyInterval, DataDir: filepath.Join(dir, "fdb-etcd.data")}
	reps, err := fdbetcd.StartReplicas(fdb, fdbReplicas, opts)
	must(t, err, "starting %d fdb-etcd replicas", fdbReplicas)
	cli, err := clientv3.New(clientv3.Config{Endpoints: reps.URLs(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	must(t, err, "etcd client")
	st := &store{name: storeFDB, urls: reps.URLs(), client: cli,
		stop: func() { cli.Close(); reps.Stop() }, logs: func() string { return reps.Logs(1 << 20) }}
	c, err := startCluster(t, st, dir)
	t.Cleanup(func() {
		if c != nil {
			c.stop()
		}
		st.stop()
		if t.Failed() || *flagKeep {
			t.Logf("logs and data kept in %s", dir)
			if c != nil && c.apiserver != nil {
				t.Logf("kube-apiserver log tail:\n%s", tail(c.apiserver.log(), 3000))
			}
			return
		}
		os.RemoveAll(dir)
	})
	must(t, err, "starting kube-apiserver")
	return &faultStack{fdb: fdb, reps: reps, c: c}
}

var (
	faultMu     sync.Mutex
	faultReport string
)

func recordFaults(w *workload, phases []faultPhase) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nkube-apiserver on three fdb-etcd replicas on FoundationDB (%d processes, %s) under faults; %d acknowledged writes, %d watch events, %d consistent LISTs:\n\n",
		faultProcesses, faultConfigure, len(w.acks), len(w.events), w.lists)
	b.WriteString("| fault | what was done | longest without a successful write | failed writes (reason: count) |\n|---|---|---|---|\n")
	for _, p := range phases {
		fmt.Fprintf(&b, "| %s | %s | %v | %s |\n", p.name, p.did, w.longestGap(p.start, p.end).Round(time.Millisecond), w.errorsBetween(p.start, p.end))
	}
	faultMu.Lock()
	faultReport = b.String()
	faultMu.Unlock()
}

func faultsReport() string {
	faultMu.Lock()
	defer faultMu.Unlock()
	return faultReport
}

// diagnose tells where events stopped: the apiserver's watch cache (a LIST
// at resourceVersion 0 is served from it), and each replica's hub (its lag
// and watchers, and whether a watch there delivers the final revision).
func (fs *faultStack) diagnose(t *testing.T, finalRV string) {
	ctx := ctxT(t, time.Minute)
	if l, err := fs.c.client.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{ResourceVersion: "0"}); err == nil {
		var rvs []string
		for _, cm := range l.Items {
			rvs = append(rvs, cm.Name+"@"+cm.ResourceVersion)
		}
		t.Logf("the watch cache is at %s (final list at %s): %s", l.ResourceVersion, finalRV, strings.Join(rvs, " "))
	}
	if m, err := fs.c.metrics(ctx); err == nil {
		for _, l := range strings.Split(m, "\n") {
			if strings.Contains(l, `resource="configmaps"`) && (strings.HasPrefix(l, "apiserver_watch_cache_events") || strings.HasPrefix(l, "apiserver_watch_events_total") || strings.HasPrefix(l, "apiserver_watch_cache_consistent") || strings.HasPrefix(l, "apiserver_watch_cache_resource_version") || strings.HasPrefix(l, "apiserver_terminated_watchers")) {
				t.Logf("apiserver: %s", l)
			}
		}
	}
	rev, _ := strconv.ParseInt(finalRV, 10, 64)
	for i, s := range fs.reps.Servers {
		var lines []string
		for _, l := range strings.Split(scrape(s.URL+"/metrics"), "\n") {
			if strings.HasPrefix(l, "fdb_etcd_watch") || strings.HasPrefix(l, "etcd_debugging_mvcc_watcher_total") {
				lines = append(lines, l)
			}
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got := "nothing"
		for wr := range cli.Watch(wctx, "/registry/configmaps/"+faultNS+"/", clientv3.WithPrefix(), clientv3.WithRev(rev-5)) {
			if n := len(wr.Events); n > 0 {
				got = fmt.Sprintf("events up to %d", wr.Events[n-1].Kv.ModRevision)
			}
		}
		cancel()
		cli.Close()
		t.Logf("replica %d: a watch from %d delivered %s in 5 s; %s", i, rev-5, got, strings.Join(lines, "; "))
	}
}

// checkCache compares the apiserver's watch cache with storage, as its
// consistency checker does (which first runs minutes after the apiserver
// starts, after this test): a consistent LIST, served from the cache, must
// name the keys storage holds at their mod revisions.
func (fs *faultStack) checkCache(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	l, err := fs.c.client.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{})
	must(t, err, "consistent list")
	cache := map[string]string{}
	for _, cm := range l.Items {
		cache[cm.Name] = cm.ResourceVersion
	}
	prefix := "/registry/configmaps/" + faultNS + "/"
	r, err := fs.c.store.client.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(mustParseRV(t, l.ResourceVersion)))
	must(t, err, "storage read at %s", l.ResourceVersion)
	stored := map[string]string{}
	for _, kv := range r.Kvs {
		stored[strings.TrimPrefix(string(kv.Key), prefix)] = strconv.FormatInt(kv.ModRevision, 10)
	}
	if !maps.Equal(cache, stored) {
		t.Errorf("the watch cache at %s differs from storage:\ncache   %v\nstorage %v", l.ResourceVersion, cache, stored)
	}
}

func mustParseRV(t *testing.T, rv string) int64 {
	n, err := strconv.ParseInt(rv, 10, 64)
	must(t, err, "resourceVersion %q", rv)
	return n
}
