package stores

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/proc"
)

// build builds pkg in dir into the test's temporary directory.
func build(t *testing.T, dir, pkg string, env ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestStart starts etcd (the pinned tools/etcd build) and fdb-etcd on
// Pebble (built from this repository) with the arguments a scale run uses,
// checks that they answer, serve pprof and metrics, and stop.
func TestStart(t *testing.T) {
	bins := Binaries{
		Etcd:    build(t, "../../tools/etcd", "go.etcd.io/etcd/server/v3"),
		FDBEtcd: build(t, "../../../..", "./cmd/fdb-etcd"),
	}
	for _, kind := range []string{Etcd, Pebble} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			st, err := Start(context.Background(), kind, bins, Options{Dir: dir, ProgressNotify: 5 * time.Second, ReadyTimeout: 2 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(st.ClientURLs) != 1 || len(st.MetricsURLs) != 1 || len(st.PIDs()) != 1 || len(st.Backing) != 0 {
				t.Errorf("urls %v %v pids %v backing %v", st.ClientURLs, st.MetricsURLs, st.PIDs(), st.Backing)
			}
			if u, err := proc.ReadUsage(st.PIDs()[0]); err != nil || u.RSS == 0 {
				t.Errorf("usage %+v, %v", u, err)
			}
			for _, u := range []string{st.ClientURLs[0] + "/debug/pprof/cmdline", st.MetricsURLs[0]} {
				resp, err := http.Get(u)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("%s: %v %v", u, resp, err)
				} else {
					resp.Body.Close()
				}
			}
			if err := st.Alive(); err != nil {
				t.Error(err)
			}
			if err := st.Stop(); err != nil {
				t.Error(err)
			}
			if err := st.Alive(); err == nil {
				t.Error("alive after Stop")
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start(context.Background(), "kine", Binaries{}, Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "unknown store") {
		t.Errorf("unknown kind: %v", err)
	}
	if _, err := Start(context.Background(), FDB, Binaries{}, Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "cluster file") {
		t.Errorf("fdb without a cluster file: %v", err)
	}
}

// TestStartFDB starts three fdb-etcd replicas on the FoundationDB cluster
// FDB_CLUSTER_FILE names (built with -tags fdb: cgo and libfdb_c, as
// eval "$(make -s fdb-env)" sets up), then clears their keyspace.
func TestStartFDB(t *testing.T) {
	cf := os.Getenv("FDB_CLUSTER_FILE")
	if cf == "" {
		t.Skip("FDB_CLUSTER_FILE is not set (go run ./internal/fdbserver/withfdb from the repository root sets it)")
	}
	bins := Binaries{FDBEtcdFDB: build(t, "../../../..", "./cmd/fdb-etcd", "CGO_ENABLED=1", "GOFLAGS=-tags=fdb")}
	st, err := Start(context.Background(), FDB, bins, Options{Dir: t.TempDir(), ClusterFile: cf, ProgressNotify: 5 * time.Second, ReadyTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.ClientURLs) != 3 || len(st.MetricsURLs) != 3 || len(st.Backing) != 1 {
		t.Errorf("urls %v %v backing %v: want three replicas on one fdbserver", st.ClientURLs, st.MetricsURLs, st.Backing)
	}
	if err := st.Stop(); err != nil {
		t.Error(err)
	}
}
