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
	flagBackends = flag.String("backends", envOr("CONFORMANCE_BACKENDS", "etcd,fdb-etcd"), "comma-separated backends to run: etcd (reference), fdb-etcd")
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
	klog.SetLogger(logr.Discard())
	code := m.Run()
	fdbetcd.Cleanup()
	if len(caseOrder) > 0 {
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
	os.Exit(code)
}

func renderTable() string {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	var b strings.Builder
	b.WriteString("## k8s.io/apiserver storage suite: fdb-etcd vs etcd (reference)\n\n")
	b.WriteString("| test | etcd | fdb-etcd |\n|---|---|---|\n")
	counts := map[string]map[string]int{"etcd": {}, "fdb-etcd": {}}
	var regressions []string
	names := append([]string(nil), caseOrder...)
	for _, n := range names {
		r := results[n]
		cell := func(be string) string {
			x, ok := r[be]
			if !ok {
				return "not run"
			}
			counts[be][x.status]++
			return fmt.Sprintf("%s (%.1fs)", x.status, x.dur.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", n, cell("etcd"), cell("fdb-etcd"))
		if r["etcd"].status == "PASS" && r["fdb-etcd"].status == "FAIL" {
			regressions = append(regressions, n)
		}
	}
	fmt.Fprintf(&b, "\netcd: %d passed, %d failed, %d skipped; fdb-etcd: %d passed, %d failed, %d skipped\n",
		counts["etcd"]["PASS"], counts["etcd"]["FAIL"], counts["etcd"]["SKIP"],
		counts["fdb-etcd"]["PASS"], counts["fdb-etcd"]["FAIL"], counts["fdb-etcd"]["SKIP"])
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
