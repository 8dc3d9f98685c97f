package scenarios

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

var (
	flagReport    = flag.String("report", os.Getenv("CONFORMANCE_SCENARIO_REPORT"), "write the scenario results and latencies (markdown) to this file")
	flagReference = flag.String("reference", envOr("CONFORMANCE_REFERENCE", "subset"), "scenarios also run on kube-apiserver over embedded etcd: none, subset (those marked reference) or all")
	flagKeep      = flag.Bool("keep", os.Getenv("CONFORMANCE_KEEP") != "", "keep the cluster directories (logs, certs) even when everything passed")
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

var (
	resMu sync.Mutex
	res   = map[string]map[string]string{}
)

func recordScenario(name, be, status string, d time.Duration) {
	resMu.Lock()
	defer resMu.Unlock()
	if res[name] == nil {
		res[name] = map[string]string{}
	}
	res[name][be] = fmt.Sprintf("%s (%.0fs)", status, d.Seconds())
}

// kubeVersion is the Kubernetes version the binaries were built at.
var kubeVersion string

func moduleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// locateKube finds (or builds, through hack/build-kube.sh) the binaries.
func locateKube() error {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" {
		kubeBinDir = d
	} else {
		cmd := exec.Command("bash", filepath.Join(moduleDir(), "hack", "build-kube.sh"))
		cmd.Dir = moduleDir()
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("hack/build-kube.sh: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		kubeBinDir = lines[len(lines)-1]
	}
	v, err := exec.Command(filepath.Join(kubeBinDir, "kube-apiserver"), "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s/kube-apiserver --version: %v %s", kubeBinDir, err, v)
	}
	kubeVersion = strings.TrimSpace(string(v))
	return nil
}

func TestMain(m *testing.M) {
	flag.Parse()
	if err := locateKube(); err != nil {
		fmt.Fprintln(os.Stderr, "scenarios:", err)
		os.Exit(1)
	}
	fmt.Printf("scenarios: %s from %s\n", kubeVersion, kubeBinDir)
	stopFDB, err := startFDB()
	if err != nil {
		fmt.Fprintln(os.Stderr, "scenarios:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopFDB(code != 0 || *flagKeep)
	fdbetcd.Cleanup()
	if len(res) > 0 || freshnessReport() != "" || faultsReport() != "" {
		rep := report()
		fmt.Print("\n" + rep)
		if *flagReport != "" {
			_ = os.MkdirAll(filepath.Dir(*flagReport), 0o755)
			_ = os.WriteFile(*flagReport, []byte(rep), 0o644)
		}
	}
	os.Exit(code)
}

// startFDB starts the run's FoundationDB cluster when the FoundationDB half
// runs (fdbetcd.FDBWanted); the returned function stops it, keeping its
// files when asked to.
func startFDB() (func(keep bool), error) {
	ok, why, err := fdbetcd.FDBWanted()
	if err != nil {
		return nil, err
	}
	if !ok {
		fmt.Printf("scenarios: not running fdb-etcd on FoundationDB: %s\n", why)
		return func(bool) {}, nil
	}
	root, err := os.MkdirTemp("", "conformance-fdb-")
	if err != nil {
		return nil, err
	}
	fdbCluster, err = fdbetcd.StartFDB(root, fdbetcd.FDBOptions{})
	if err != nil {
		return nil, fmt.Errorf("starting FoundationDB: %w", err)
	}
	fmt.Printf("scenarios: FoundationDB cluster %s\n", fdbCluster.ClusterFile)
	return func(keep bool) {
		fdbCluster.Stop()
		if keep {
			fmt.Printf("scenarios: FoundationDB files kept in %s\n", root)
			return
		}
		os.RemoveAll(root)
	}, nil
}

// stores are the stores of the run, in report order: fdb-etcd on its
// embedded store, three fdb-etcd replicas on FoundationDB when it runs, and
// the reference.
func stores() []string {
	if fdbCluster == nil {
		return []string{storeEmbedded, storeEtcd}
	}
	return []string{storeEmbedded, storeFDB, storeEtcd}
}

var storeTitles = map[string]string{
	storeEmbedded: "fdb-etcd (embedded)",
	storeFDB:      fmt.Sprintf("fdb-etcd (FoundationDB, %d replicas)", fdbReplicas),
	storeEtcd:     "etcd (reference)",
}

func report() string {
	resMu.Lock()
	defer resMu.Unlock()
	var b strings.Builder
	if len(res) > 0 {
		fmt.Fprintf(&b, "## kube-apiserver scenarios (%s)\n\n| scenario |", kubeVersion)
		for _, be := range stores() {
			fmt.Fprintf(&b, " %s |", storeTitles[be])
		}
		b.WriteString("\n|---|" + strings.Repeat("---|", len(stores())) + "\n")
		// Stores run side by side, so the order results came in says
		// little: the table follows the scenario list.
		order := []string{"DeployDryRun", "MirrorCutover", "TwoTenants"}
		for _, sc := range scenarios() {
			order = append(order, sc.name)
		}
		for _, n := range order {
			if res[n] != nil {
				b.WriteString(scenarioRow(n))
			}
		}
	}
	b.WriteString(freshnessReport())
	b.WriteString(faultsReport())
	return b.String()
}

// scenarioRow is one scenario's row of the report. The caller holds resMu.
func scenarioRow(n string) string {
	row := "| " + n + " |"
	for _, be := range stores() {
		cell := "not run"
		if s, ok := res[n][be]; ok {
			cell = s
		}
		row += " " + cell + " |"
	}
	return row + "\n"
}

// startStack starts the store named be (storeEmbedded, storeFDB or
// storeEtcd) and a kube-apiserver on it in a fresh directory; both stop when
// t ends, and the directory goes too unless t failed or -keep is set.
func startStack(t *testing.T, be string) *cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "conformance-"+be+"-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := startStore(dir, be)
	if err != nil {
		t.Fatalf("starting %s: %v", be, err)
	}
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
	if err != nil {
		t.Fatalf("starting kube-apiserver on %s: %v", be, err)
	}
	return c
}

// runScenarios runs the scenarios on a fresh stack of store be, all of
// them or the reference subset; quiet is called when the busy ones are done
// (see busyStacks).
func runScenarios(t *testing.T, be string, all bool, quiet func()) {
	c := startStack(t, be)
	for _, sc := range scenarios() {
		sc := sc
		if !all && !sc.reference {
			continue
		}
		if sc.name == "ConsistencyChecker" {
			quiet()
		}
		t.Run(sc.name, func(t *testing.T) {
			start := time.Now()
			t.Cleanup(func() {
				status := "PASS"
				if t.Failed() {
					status = "FAIL"
				}
				recordScenario(sc.name, be, status, time.Since(start))
			})
			if c.apiserver.exited() && sc.name != "ConsistencyChecker" {
				t.Fatalf("kube-apiserver is not running: %v", c.apiserver.err)
			}
			sc.run(t, c)
		})
	}
}

// busyStacks counts TestScenarios' stores still in their busy scenarios:
// those before the consistency checker, which then waits minutes (the
// apiserver checks every 5-7.5 min) with the CPU all but idle.
// TestTenantsShareStore starts once it is zero, so that its run fills that
// wait and neither test's timed scenarios share the CPU with the other's
// busy ones.
var busyStacks sync.WaitGroup

// TestScenarios runs every scenario against kube-apiserver on fdb-etcd (on
// its embedded store and on FoundationDB when it runs) and the reference
// subset against kube-apiserver on an embedded etcd. The stores' runs go
// side by side, and beside TestTenantsShareStore (see busyStacks): each
// spends most of its time waiting for the apiserver's consistency checker,
// which first runs minutes after the apiserver starts.
func TestScenarios(t *testing.T) {
	if _, err := fdbetcd.Binary(); err != nil {
		t.Fatal(err)
	}
	type run struct {
		be  string
		all bool
	}
	var runs []run
	for _, be := range stores() {
		all := true
		if be == storeEtcd {
			if *flagReference == "none" {
				continue
			}
			all = *flagReference == "all"
		}
		runs = append(runs, run{be, all})
	}
	// Counted before t.Parallel: TestTenantsShareStore waits only after
	// every top-level test got this far.
	busyStacks.Add(len(runs))
	t.Parallel()
	for _, r := range runs {
		quiet := sync.OnceFunc(busyStacks.Done)
		started := false
		t.Run(r.be, func(t *testing.T) {
			started = true
			defer quiet()
			t.Parallel()
			runScenarios(t, r.be, r.all, quiet)
		})
		if !started { // filtered out by -run
			quiet()
		}
	}
}
