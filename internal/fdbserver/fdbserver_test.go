//go:build fdb

package fdbserver

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tests start real fdbserver processes. They carry the fdb tag so that
// they run with the other FoundationDB suites (make test-fdb), which fail
// rather than skip without FoundationDB.

func requireFDB(t *testing.T) {
	t.Helper()
	if m := Missing(); m != "" {
		if os.Getenv("FDB_TESTS_REQUIRED") != "" {
			t.Fatalf("FoundationDB tests cannot run: %s", m)
		}
		t.Skipf("skipping: %s", m)
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestBinDir(t *testing.T) {
	dir := t.TempDir()
	_, err := StartCluster(Config{BinDir: dir})
	if err == nil || !strings.Contains(err.Error(), "fdbserver not found in "+dir) {
		t.Fatalf("StartCluster with an empty BinDir: %v, want fdbserver not found", err)
	}
	t.Setenv("FDB_HOME", dir)
	if got := (Config{}).withDefaults().BinDir; got != filepath.Join(dir, "bin") {
		t.Fatalf("BinDir with FDB_HOME=%s is %q, want its bin/", dir, got)
	}
	if m := Missing(); !strings.Contains(m, filepath.Join(dir, "bin")) {
		t.Fatalf("Missing() with FDB_HOME and no executables = %q", m)
	}
}

func TestSingleProcess(t *testing.T) {
	requireFDB(t)
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(t.Failed()) }()
	st, err := c.Status(testCtx(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Available || len(st.Roles["master"]) != 1 || c.Size() != 1 {
		t.Fatalf("status of a fresh single-process cluster: %+v", st)
	}
}

// TestReplicatedClusterFaults starts a 5-process double ssd-2 cluster and
// puts it through every fault the package offers, checking after each that
// FoundationDB noticed (roles moved, a new generation) and recovered.
func TestReplicatedClusterFaults(t *testing.T) {
	requireFDB(t)
	c, err := StartCluster(Config{Processes: 5, Redundancy: "double", Storage: "ssd-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(t.Failed()) }()
	ctx := testCtx(t, 10*time.Minute)
	last := time.Now()
	step := func(what string) {
		t.Logf("%s: %v", what, time.Since(last).Round(time.Millisecond))
		last = time.Now()
	}
	st := status(t, c)
	if len(st.Reporting) != 5 || len(st.Roles["coordinator"]) != 3 {
		t.Fatalf("want 5 processes and 3 coordinators: %+v", st)
	}
	for _, role := range []string{"master", "cluster_controller", "log", "storage", "commit_proxy", "grv_proxy"} {
		if len(st.Roles[role]) == 0 {
			t.Fatalf("no process holds %s: %+v", role, st.Roles)
		}
	}

	// Kill -9 the master's process: a recovery elects a new one.
	master := st.Roles["master"][0]
	gen := st.Generation
	must(t, c.Kill(master))
	if c.Running(master) {
		t.Fatal("killed process still running")
	}
	must(t, c.WaitAvailable(ctx))
	must(t, c.Restart(master))
	must(t, c.WaitHealthy(ctx))
	st = status(t, c)
	if st.Generation <= gen || len(st.Roles["master"]) != 1 {
		t.Fatalf("after killing the master: generation %d -> %d", gen, st.Generation)
	}
	step("kill -9 the master, restart, healthy")

	// A paused process comes back when continued.
	must(t, c.Pause(1))
	if !c.Running(1) {
		t.Fatal("a paused process counts as running")
	}
	time.Sleep(2 * time.Second)
	must(t, c.Resume(1))
	must(t, c.WaitHealthy(ctx))
	step("pause 2 s, resume, healthy")

	// fdbcli kill reboots every process; each is restarted.
	gen = status(t, c).Generation
	must(t, c.ForceRecovery(ctx))
	must(t, c.WaitHealthy(ctx))
	if g := status(t, c).Generation; g <= gen {
		t.Fatalf("forced recovery: generation %d -> %d", gen, g)
	}
	step("fdbcli kill all, restart, healthy")

	// Exclude moves everything off a process; include brings it back.
	victim := 4
	must(t, c.Exclude(ctx, victim))
	if roles := rolesOf(status(t, c), victim); slices.Contains(roles, "storage") || slices.Contains(roles, "log") {
		t.Fatalf("excluded process still holds %v", roles)
	}
	must(t, c.Include(ctx, victim))
	step("exclude, include")

	// The whole cluster lost at once comes back from its disks.
	c.KillAll()
	for i := range c.Size() {
		if c.Running(i) {
			t.Fatalf("process %d survived KillAll", i)
		}
	}
	must(t, c.RestartAll())
	must(t, c.WaitHealthy(ctx))
	step("kill all, restart all, healthy")
}

// TestTripleRedwood: the other redundancy mode and storage engine start
// and replicate too.
func TestTripleRedwood(t *testing.T) {
	requireFDB(t)
	c, err := StartCluster(Config{Processes: 5, Redundancy: "triple", Storage: "ssd-redwood-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Stop(t.Failed()) }()
	out, err := c.cli(testCtx(t, time.Minute), "status", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Redundancy mode        - triple", "Storage engine         - ssd-redwood-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

func status(t *testing.T, c *Cluster) Status {
	t.Helper()
	st, err := c.Status(testCtx(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func rolesOf(st Status, i int) []string {
	var out []string
	for role, ps := range st.Roles {
		if slices.Contains(ps, i) {
			out = append(out, role)
		}
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
