package storage

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// Results of every case on every backend, for the pass/fail table.
type result struct {
	status string // PASS, FAIL, SKIP
	dur    time.Duration
}

var (
	resultsMu sync.Mutex
	results   = map[string]map[string]result{} // case -> backend -> result
	caseOrder []string

	flagTable    = flag.String("table", "", "write the fdb-etcd vs etcd pass/fail table (markdown) to this file")
	flagResults  = flag.String("results", "", "also write this run's results (JSON) to this file, for -merge")
	flagMerge    = flag.String("merge", "", "comma-separated result files of earlier runs (-results): write their table (-table) and run no test")
	flagBackends = flag.String("backends", envOr("CONFORMANCE_BACKENDS", "etcd,fdb-etcd,fdb-etcd-fdb"), "comma-separated backends to run: etcd (reference), fdb-etcd (embedded store), fdb-etcd-fdb (three replicas on FoundationDB, when it is found: see fdbetcd.EnvFDB)")
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func record(name, be string, r result) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	if results[name] == nil {
		results[name] = map[string]result{}
		caseOrder = append(caseOrder, name)
	}
	results[name][be] = r
}

func TestMain(m *testing.M) {
	flag.Parse()
	if *flagMerge != "" {
		if err := loadResults(strings.Split(*flagMerge, ",")); err != nil {
			fmt.Fprintln(os.Stderr, "storage:", err)
			os.Exit(1)
		}
		writeTable()
		os.Exit(0)
	}
	klog.SetLogger(logr.Discard())
	stopFDB, err := startFDB()
	if err != nil {
		fmt.Fprintln(os.Stderr, "storage:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopFDB(code != 0)
	fdbetcd.Cleanup()
	if *flagResults != "" {
		if err := saveResults(*flagResults); err != nil {
			fmt.Fprintln(os.Stderr, "storage: writing results:", err)
			code = 1
		}
	}
	writeTable()
	os.Exit(code)
}

// writeTable prints the pass/fail table of the recorded results and writes
// it to -table (or $CONFORMANCE_TABLE).
func writeTable() {
	if len(caseOrder) == 0 {
		return
	}
	table := renderTable()
	fmt.Print("\n" + table)
	path := *flagTable
	if path == "" {
		path = os.Getenv("CONFORMANCE_TABLE")
	}
	if path != "" {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "writing table:", err)
		}
	}
}

// startFDB starts the run's FoundationDB cluster when the FoundationDB half
// runs and the fdb-etcd-fdb backend is selected; the returned function stops
// it, keeping its files when the run failed.
func startFDB() (func(failed bool), error) {
	ok, why, err := fdbetcd.FDBWanted()
	if err != nil {
		return nil, err
	}
	if !ok || !wantBackend(backendFDB.name) {
		if wantBackend(backendFDB.name) {
			fmt.Printf("storage: not running fdb-etcd on FoundationDB: %s\n", why)
		}
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
	fmt.Printf("storage: FoundationDB cluster %s\n", fdbCluster.ClusterFile)
	return func(failed bool) {
		fdbCluster.Stop()
		if failed {
			fmt.Printf("storage: FoundationDB files kept in %s\n", root)
			return
		}
		os.RemoveAll(root)
	}, nil
}

func renderTable() string {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	var b strings.Builder
	b.WriteString("## k8s.io/apiserver storage suite: fdb-etcd vs etcd (reference)\n\n")
	b.WriteString("fdb-etcd: the embedded store; fdb-etcd-fdb: three replicas on FoundationDB, the client balancing over them.\n\n")
	b.WriteString("| test | etcd | fdb-etcd | fdb-etcd-fdb |\n|---|---|---|---|\n")
	names := []string{"etcd", "fdb-etcd", "fdb-etcd-fdb"}
	counts := map[string]map[string]int{}
	for _, be := range names {
		counts[be] = map[string]int{}
	}
	var regressions []string
	for _, n := range caseOrder {
		r := results[n]
		cells := make([]string, len(names))
		for i, be := range names {
			x, ok := r[be]
			if !ok {
				cells[i] = "not run"
				continue
			}
			counts[be][x.status]++
			cells[i] = fmt.Sprintf("%s (%.1fs)", x.status, x.dur.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s |\n", n, strings.Join(cells, " | "))
		for _, be := range names[1:] {
			if r["etcd"].status == "PASS" && r[be].status == "FAIL" {
				regressions = append(regressions, n+" on "+be)
			}
		}
	}
	b.WriteString("\n")
	for _, be := range names {
		fmt.Fprintf(&b, "%s: %d passed, %d failed, %d skipped. ", be, counts[be]["PASS"], counts[be]["FAIL"], counts[be]["SKIP"])
	}
	b.WriteString("\n")
	if len(regressions) > 0 {
		fmt.Fprintf(&b, "passing on etcd but failing on fdb-etcd: %s\n", strings.Join(regressions, ", "))
	}
	return b.String()
}

func wantBackend(name string) bool {
	for _, b := range strings.Split(*flagBackends, ",") {
		if strings.TrimSpace(b) == name {
			return true
		}
	}
	return false
}

func runSuite(t *testing.T, suite string, cases []testCase) {
	for _, be := range backends {
		be := be
		t.Run(be.name, func(t *testing.T) {
			if !wantBackend(be.name) {
				t.Skipf("backend %s not selected (-backends / CONFORMANCE_BACKENDS)", be.name)
			}
			if be.name == backendFDB.name && fdbCluster == nil {
				t.Skip("FoundationDB not found (see fdbetcd.EnvFDB)")
			}
			for _, c := range cases {
				c := c
				name := suite + "/" + c.name
				t.Run(c.name, func(t *testing.T) {
					start := time.Now()
					t.Cleanup(func() {
						st := "PASS"
						switch {
						case t.Failed():
							st = "FAIL"
						case t.Skipped():
							st = "SKIP"
						}
						record(name, be.name, result{status: st, dur: time.Since(start)})
					})
					if c.skip != "" {
						t.Skip(c.skip)
					}
					c.run(t, be)
				})
			}
		})
	}
}

// TestEtcd3 runs k8s.io/apiserver's storage tests on etcd3.New stores, first
// against an embedded etcd (the reference), then against fdb-etcd; each test
// gets a fresh server.
func TestEtcd3(t *testing.T) { runSuite(t, "etcd3", etcd3Cases()) }

// TestCacher runs the same suite through the watch cache
// (cacher.NewCacherFromConfig + cacher.NewCacheDelegator).
func TestCacher(t *testing.T) { runSuite(t, "cacher", cacherCases()) }
