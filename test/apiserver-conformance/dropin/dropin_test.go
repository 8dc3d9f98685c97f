// Package dropin runs fdb-etcd where Kubernetes' integration tests expect
// the etcd binary: fdb-etcd is built and installed as `etcd` on PATH, and
// the test framework (k8s.io/kubernetes/test/integration/framework) starts
// it exactly as it starts etcd — its own flags, its unix socket, its
// readiness check — for tests it runs unchanged.
package dropin

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/klog/v2/ktesting"

	"k8s.io/kubernetes/test/integration/framework"
)

var (
	flagPackages = flag.String("packages", "k8s.io/kubernetes/test/integration/apiserver,k8s.io/kubernetes/test/integration/apimachinery",
		"comma-separated Kubernetes integration test packages to run with fdb-etcd as etcd")
	flagRun     = flag.String("run", "^Test", "-test.run for those packages")
	flagTimeout = flag.Duration("pkg-timeout", 80*time.Minute, "-test.timeout for each package")
	flagReport  = flag.String("report", "", "write the per-test table (markdown) here")
)

// notApplicableMsg is what fdb-etcd logs once at start: the evidence that
// the `etcd` the framework started was fdb-etcd.
const notApplicableMsg = "flags accepted for etcd compatibility have no effect here"

// installEtcd builds ../../../cmd/fdb-etcd as dir/etcd (or copies
// $DROPIN_FDB_ETCD). With DROPIN_BACKEND=fdb, dir/etcd is instead a
// script that runs fdb-etcd on the FoundationDB cluster in
// FDB_CLUSTER_FILE, each process in its own keyspace (--fdb-prefix), since
// the framework starts several etcds that must not share data.
func installEtcd(t testing.TB, dir string) {
	t.Helper()
	bin := os.Getenv("DROPIN_FDB_ETCD")
	if bin == "" {
		root, err := filepath.Abs(filepath.Join("..", "..", ".."))
		if err != nil {
			t.Fatal(err)
		}
		bin = filepath.Join(dir, "fdb-etcd")
		args := []string{"build", "-o", bin}
		if os.Getenv("DROPIN_BACKEND") == "fdb" {
			args = append(args, "-tags", "fdb")
		}
		cmd := exec.Command(goBinary(), append(args, "./cmd/fdb-etcd")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/fdb-etcd: %v\n%s", err, out)
		}
	}
	etcd := filepath.Join(dir, "etcd")
	if os.Getenv("DROPIN_BACKEND") != "fdb" {
		if err := os.Symlink(bin, etcd); err != nil {
			t.Fatal(err)
		}
		return
	}
	cf := os.Getenv("FDB_CLUSTER_FILE")
	if cf == "" {
		t.Fatal("DROPIN_BACKEND=fdb needs FDB_CLUSTER_FILE (run under internal/fdbserver/withfdb)")
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %q --backend=fdb --fdb-cluster-file=%q --fdb-prefix=\"dropin/$$-$(date +%%s%%N)\" \"$@\"\n", bin, cf)
	if err := os.WriteFile(etcd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func goBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// closedURL is an etcd URL nothing listens on, so that the framework's
// EtcdMain starts its own etcd instead of using one at 127.0.0.1:2379.
func closedURL(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// TestRunCustomEtcd calls the framework's own start-up, RunCustomEtcd,
// with fdb-etcd on PATH: it must answer on the unix socket the framework
// chose, and stop on the framework's SIGTERM.
func TestRunCustomEtcd(t *testing.T) {
	bin := t.TempDir()
	installEtcd(t, bin)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	logger, _ := ktesting.NewTestContext(t)
	url, stop, err := framework.RunCustomEtcd(logger, "dropin_etcd", []string{"--watch-progress-notify-interval", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		stop()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/registry/k", "v"); err != nil {
		t.Errorf("put at %s: %v", url, err)
	}
	st, err := cli.Status(ctx, url)
	if err != nil {
		t.Errorf("status: %v", err)
	} else {
		t.Logf("%s answers as etcd %s, revision %d", url, st.Version, st.Header.Revision)
	}
	cli.Close()
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the framework's stop did not return in 20s")
	}
	checkFDBKeyspaces(t)
}

// checkFDBKeyspaces makes sure, with DROPIN_BACKEND=fdb, that the etcds
// kept their data in FoundationDB: some key lies under the tuple-encoded
// prefix "dropin/" the script gives them.
func checkFDBKeyspaces(t *testing.T) {
	t.Helper()
	if os.Getenv("DROPIN_BACKEND") != "fdb" {
		return
	}
	out, err := exec.Command("fdbcli", "-C", os.Getenv("FDB_CLUSTER_FILE"), "--exec",
		`getrange "\x02dropin/" "\x02dropin0" 1`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "`\\x02dropin/") {
		t.Fatalf("no fdb-etcd keyspace under dropin/ in FoundationDB: %v\n%s", err, out)
	}
}

var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)`)

// TestKubernetesIntegration runs each package's upstream tests, compiled
// from the pinned Kubernetes module, with fdb-etcd installed as etcd.
func TestKubernetesIntegration(t *testing.T) {
	bin := t.TempDir()
	installEtcd(t, bin)
	var table []string
	for _, pkg := range strings.Split(*flagPackages, ",") {
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			rows, out := runPackage(t, bin, pkg)
			table = append(table, rows...)
			if !strings.Contains(out, notApplicableMsg) {
				t.Errorf("no line %q in the output: the etcd the framework started was not fdb-etcd", notApplicableMsg)
			}
		})
	}
	checkFDBKeyspaces(t)
	if *flagReport != "" {
		report := "| package | test | result | seconds |\n|---|---|---|---|\n" + strings.Join(table, "\n") + "\n"
		if err := os.MkdirAll(filepath.Dir(*flagReport), 0o755); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(*flagReport, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runPackage compiles pkg's tests and runs them in the package's source
// directory (where their fixtures are), with bin first on PATH.
func runPackage(t *testing.T, bin, pkg string) (rows []string, output string) {
	dirOut, err := exec.Command(goBinary(), "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	testBin := filepath.Join(t.TempDir(), filepath.Base(pkg)+".test")
	start := time.Now()
	if out, err := exec.Command(goBinary(), "test", "-c", "-o", testBin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, out)
	}
	t.Logf("compiled %s in %v", pkg, time.Since(start).Round(time.Second))
	cmd := exec.Command(testBin, "-test.run", *flagRun, "-test.v", "-test.timeout", flagTimeout.String())
	cmd.Dir = strings.TrimSpace(string(dirOut))
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBE_INTEGRATION_ETCD_URL="+closedURL(t))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start = time.Now()
	runErr := cmd.Run()
	logPath := filepath.Join(t.TempDir(), "output.log")
	_ = os.WriteFile(logPath, buf.Bytes(), 0o644)
	counts := map[string]int{}
	var failed []string
	sc := bufio.NewScanner(bytes.NewReader(buf.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := resultLine.FindStringSubmatch(sc.Text())
		if m == nil || strings.Contains(m[2], "/") {
			continue
		}
		counts[m[1]]++
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |", filepath.Base(pkg), m[2], m[1], m[3]))
		if m[1] == "FAIL" {
			failed = append(failed, m[2])
		}
	}
	sort.Strings(failed)
	t.Logf("%s: %d passed, %d failed, %d skipped in %v (output: %s)", pkg, counts["PASS"], counts["FAIL"], counts["SKIP"],
		time.Since(start).Round(time.Second), logPath)
	var ee *exec.ExitError
	if runErr != nil && !errors.As(runErr, &ee) {
		t.Fatalf("running %s: %v", testBin, runErr)
	}
	if len(failed) > 0 || runErr != nil || counts["PASS"] == 0 {
		t.Errorf("%s failed: %v (exit: %v)\n%s", pkg, failed, runErr, tailOf(buf.String(), 6000))
	}
	return rows, buf.String()
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
