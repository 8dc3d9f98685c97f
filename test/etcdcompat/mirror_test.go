package etcdcompat

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// mixedLoad makes ops writes on etcd: puts, deletes, txns of several keys,
// and leases granted, given keys and revoked.
func mixedLoad(t *testing.T, cli *clientv3.Client, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 9))
	key := func() string { return fmt.Sprintf("load/%02d", rng.IntN(50)) }
	var leases []clientv3.LeaseID
	for i := 0; i < ops; i++ {
		ctx, cancel := ctxOp()
		var err error
		switch rng.IntN(8) {
		case 0:
			_, err = cli.Delete(ctx, key())
		case 1:
			a, b := key(), key()
			if a > b {
				a, b = b, a
			}
			_, err = cli.Delete(ctx, a, clientv3.WithRange(b))
		case 2:
			// etcd refuses a txn that names one key twice.
			a, b := key(), key()
			if a == b {
				b += "x"
			}
			_, err = cli.Txn(ctx).Then(clientv3.OpPut(a, strconv.Itoa(i)), clientv3.OpPut(b, strconv.Itoa(i)), clientv3.OpDelete(a+"/sub")).Commit()
		case 3:
			var g *clientv3.LeaseGrantResponse
			if g, err = cli.Grant(ctx, 600); err == nil {
				leases = append(leases, g.ID)
				_, err = cli.Put(ctx, key(), "leased", clientv3.WithLease(g.ID))
			}
		case 4:
			if len(leases) > 0 {
				n := rng.IntN(len(leases))
				_, err = cli.Revoke(ctx, leases[n])
				leases = append(leases[:n], leases[n+1:]...)
			}
		default:
			_, err = cli.Put(ctx, key(), strconv.Itoa(i))
		}
		cancel()
		if err != nil {
			t.Errorf("load on etcd: %v", err)
			return
		}
	}
}

// mirrorMetric reads one metric of the mirror's /metrics.
func mirrorMetric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no %s in the mirror's metrics", name)
}

// TestMirrorCompat mirrors a real etcd under a mixed write load, makes the
// cut-over (writes stopped, zero lag, mirror stopped), serves the copy and
// compares what both answer: Ranges at every revision, Watch from past
// revisions, HashKV, the leases.
func TestMirrorCompat(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	if candidateKind != "fdb-etcd" {
		t.Skip("mirrors into fdb-etcd only")
	}
	ports, err := freePorts(t, 6)
	if err != nil {
		t.Fatal(err)
	}
	etcdDir := t.TempDir()
	ref, stopRef, err := startEmbeddedOn(t, etcdDir, ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	compactRev := importWorkload(t, ref.cli)

	// The load runs while the mirror loads its snapshot and then follows.
	// It is kept small enough that a watch from the compaction revision
	// delivers all of it within the harness's collection deadline
	// (watchMax) on a loaded machine.
	var loaders sync.WaitGroup
	for i := range 3 {
		loaders.Add(1)
		go func() { defer loaders.Done(); mixedLoad(t, ref.cli, uint64(i), 250) }()
	}
	store := newCandStore(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", ports[2])
	imported := time.Now() // the mirror imports the source's snapshot first
	cmd, exited, logPath := startMirror(t, ref, store, metrics)

	loaders.Wait()

	// Cut-over: writes stopped; wait for zero lag; stop the mirror.
	head := p0Rev(t, ref)
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_revision", head)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("mirror exited with %v; log:\n%s", err, tailFile(logPath, 4000))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("mirror did not stop within 60s of SIGTERM")
	}
	for _, line := range strings.Split(tailFile(logPath, 2000), "\n") {
		if strings.Contains(line, "mirror stopped and published") {
			t.Logf("%s", line)
		}
	}

	// As in the import test, the reference restarts so that it computes
	// HashKV at its compaction revision from its data.
	stopRef()
	ref, stopRef, err = startEmbeddedOn(t, etcdDir, ports[3], ports[4])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopRef)
	cand, stopCand, err := startFDBEtcd(t, ports[5], pairOptions{store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopCand)
	p := &pair{ref: ref, cand: cand}
	t.Logf("etcd at revision %d, compacted at %d", head, compactRev)
	for rev := compactRev - 1; rev <= head+1; rev++ {
		p.check(t, fmt.Sprintf("full range at revision %d", rev), allRange(rev))
	}
	for _, rev := range []int64{0, compactRev, compactRev + 1, (compactRev + head) / 2, head - 1, head} {
		checkHashKV(t, p, rev)
	}
	checkImportedWatches(t, p, compactRev, head)
	checkImportedLeases(t, p, imported)
}

// startMirror starts `fdb-etcd mirror` from ref into store, serving its
// metrics on metrics; exited reports its end, logPath holds its log.
func startMirror(t *testing.T, ref *server, store *candStore, metrics string) (cmd *exec.Cmd, exited <-chan error, logPath string) {
	t.Helper()
	logPath = filepath.Join(t.TempDir(), "mirror.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"mirror", "--from", ref.url, "--listen-metrics-urls", "http://" + metrics}, store.args()...)
	cmd = exec.Command(fdbBinary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("mirror log:\n%s", tailFile(logPath, 6000))
		}
	})
	return cmd, done, logPath
}

// waitMirrorMetric waits up to a minute for the mirror's metric name to
// read want.
func waitMirrorMetric(t *testing.T, metrics, name string, want int64) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		v, err := mirrorMetric(metrics, name)
		if err == nil && int64(v) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("mirror's %s is %v (%v), etcd at %d after 60s", name, v, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMirrorQuietSource mirrors an etcd that takes no writes after its
// snapshot: the mirror must report itself caught up (revision and source
// revision at the snapshot's, zero lag) although no watch event ever
// arrives, or a cut-over waiting for zero lag waits forever.
func TestMirrorQuietSource(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	if candidateKind != "fdb-etcd" {
		t.Skip("mirrors into fdb-etcd only")
	}
	ports, err := freePorts(t, 3)
	if err != nil {
		t.Fatal(err)
	}
	ref, stopRef, err := startEmbeddedOn(t, t.TempDir(), ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopRef)
	importWorkload(t, ref.cli)
	head := p0Rev(t, ref)
	metrics := fmt.Sprintf("127.0.0.1:%d", ports[2])
	startMirror(t, ref, newCandStore(t), metrics)
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_revision", head)
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_source_revision", head)
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_lag_revisions", 0)

	// And the first write after the snapshot is followed.
	ctx, cancel := ctxOp()
	defer cancel()
	if _, err := ref.cli.Put(ctx, "after-snapshot", "1"); err != nil {
		t.Fatal(err)
	}
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_revision", head+1)
	waitMirrorMetric(t, metrics, "fdb_etcd_mirror_source_revision", head+1)
}

// p0Rev is a server's current revision.
func p0Rev(t *testing.T, s *server) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	r, err := s.cli.Get(ctx, "\x00")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}
