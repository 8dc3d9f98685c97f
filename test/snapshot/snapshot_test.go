// Package snapshot checks that fdb-etcd's Maintenance.Snapshot is a real
// etcd v3.6 snapshot: etcdutl (v3.6.16) can check and restore it, and an
// etcd started on the restored data dir serves the same keys, history,
// revisions, compaction, leases and HashKV as fdb-etcd — and as a reference
// etcd that was sent the same requests.
package snapshot

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.uber.org/zap"
)

var (
	fdbBinary   string
	fdbBuildErr error
	// fdbCluster is the FoundationDB cluster file fdb-etcd runs on with
	// SNAPSHOT_BACKEND=fdb (each server in a keyspace of its own); empty
	// for the embedded store.
	fdbCluster string
)

func TestMain(m *testing.M) {
	code := func() int {
		tmp, err := os.MkdirTemp("", "snapshot-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.RemoveAll(tmp)
		if os.Getenv("SNAPSHOT_BACKEND") == "fdb" {
			fdbCluster = os.Getenv("FDB_CLUSTER_FILE")
			if _, err := os.Stat(fdbCluster); fdbCluster == "" || err != nil {
				fmt.Fprintf(os.Stderr, "snapshot: SNAPSHOT_BACKEND=fdb needs FDB_CLUSTER_FILE naming a cluster file: %v\n", err)
				return 2
			}
			fmt.Fprintf(os.Stderr, "snapshot: fdb-etcd runs on FoundationDB, cluster file %s\n", fdbCluster)
		}
		fdbBinary, fdbBuildErr = buildFDBEtcd(tmp)
		return m.Run()
	}()
	os.Exit(code)
}

// buildFDBEtcd builds ../../cmd/fdb-etcd into dir (or uses
// $SNAPSHOT_TEST_BINARY), with FoundationDB support when the tests run
// there.
func buildFDBEtcd(dir string) (string, error) {
	if b := os.Getenv("SNAPSHOT_TEST_BINARY"); b != "" {
		return b, nil
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "fdb-etcd")
	args := []string{"build", "-o", out}
	if fdbCluster != "" {
		args = append(args, "-tags", "fdb")
	}
	cmd := exec.Command(goBin, append(args, "./cmd/fdb-etcd")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/fdb-etcd: %v\n%s", err, b)
	}
	return out, nil
}

// handedOut is every port freePorts returned in this test binary. Once its
// probe listener is closed a port is free to the kernel again, and a later
// call (the client port of an etcd whose peer port was just chosen) could
// return it before the first caller's server bound it: one such pair failed
// CI with "address already in use".
var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
)

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			t.Fatal("no free port")
		}
		port := 20000 + mrand.IntN(12000)
		if handedOut[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		ports = append(ports, port)
		handedOut[port] = true
	}
	return ports
}

func newClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// startFDBEtcd runs the fdb-etcd binary on a fresh store: a pebble data
// dir, or a new keyspace of the FoundationDB cluster.
func startFDBEtcd(t *testing.T) (*clientv3.Client, string) {
	t.Helper()
	if fdbBuildErr != nil {
		t.Fatalf("fdb-etcd unavailable: %v", fdbBuildErr)
	}
	u := fmt.Sprintf("http://127.0.0.1:%d", freePorts(t, 1)[0])
	logPath := filepath.Join(t.TempDir(), "fdb-etcd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--name", "fdb", "--data-dir", t.TempDir(), "--listen-client-urls", u, "--advertise-client-urls", u}
	if fdbCluster != "" {
		var id [8]byte
		_, _ = crand.Read(id[:])
		args = append(args, "--backend", "fdb", "--fdb-cluster-file", fdbCluster, "--fdb-prefix", "snapshot/"+hex.EncodeToString(id[:]))
	}
	cmd := exec.Command(fdbBinary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			logf.Close()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("fdb-etcd log:\n%s", b[max(0, len(b)-4000):])
		}
	})
	cli := newClient(t, u)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "probe")
		cancel()
		if err == nil {
			return cli, u
		}
		select {
		case <-exited:
			t.Fatalf("fdb-etcd exited: see log")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fdb-etcd not serving: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startEtcd starts an embedded etcd v3.6.16 named name on dir, which is
// either empty or restored by etcdutl for the same name and peer URL.
func startEtcd(t *testing.T, name, dir string, peerPort int) (*clientv3.Client, string) {
	t.Helper()
	ports := freePorts(t, 1)
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{curl}
	cfg.AdvertiseClientUrls = []url.URL{curl}
	cfg.ListenPeerUrls = []url.URL{purl}
	cfg.AdvertisePeerUrls = []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(name)
	cfg.InitialClusterToken = "snapshot-test"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	cli := newClient(t, curl.String())
	waitStorageVersion(t, cli, curl.String())
	return cli, curl.String()
}

// waitStorageVersion waits until etcd has written meta/storageVersion, which
// it does from a monitor that runs every 4 s, not at start: a snapshot taken
// before that lacks the key and its version (fdb-etcd writes it at once).
func waitStorageVersion(t *testing.T, cli *clientv3.Client, endpoint string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := cli.Status(ctx, endpoint)
		cancel()
		if err == nil && s.StorageVersion != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd at %s wrote no storage version: %v", endpoint, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type op func(ctx context.Context, cli *clientv3.Client) error

func put(k, v string, opts ...clientv3.OpOption) op {
	return func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Put(ctx, k, v, opts...)
		return err
	}
}

func del(k string, opts ...clientv3.OpOption) op {
	return func(ctx context.Context, cli *clientv3.Client) error {
		_, err := cli.Delete(ctx, k, opts...)
		return err
	}
}

// history is the workload: keys with several versions, a transaction with
// several changes in one revision, big (chunked) values, a key with a NUL,
// leases with keys, a revoke, and a compaction at a revision that deletes a
// key, followed by more history.
func history() (before, after []op, compactAt int64) {
	big := func(seed byte, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7) + seed
		}
		return string(b)
	}
	before = []op{
		put("a", "1"),                             // 2
		put("b", "1"),                             // 3
		put("a", "2"),                             // 4
		put("big", big(1, 300_000)),               // 5
		put("k\x00z", "nul"),                      // 6
		put("l1", "x", clientv3.WithLease(0x100)), // 7
		put("l2", "x", clientv3.WithLease(0x100)), // 8
		put("l3", "x", clientv3.WithLease(0x200)), // 9
		del("a"), // 10
		func(ctx context.Context, cli *clientv3.Client) error { // 11: three changes
			_, err := cli.Txn(ctx).Then(clientv3.OpPut("c", "1"), clientv3.OpPut("d", "1"), clientv3.OpDelete("b")).Commit()
			return err
		},
		put("c", "2"), // 12
		del("c"),      // 13: a tombstone at the compaction revision
		put("e", "1"), // 14
		func(ctx context.Context, cli *clientv3.Client) error { // 15: deletes l3
			_, err := cli.Revoke(ctx, 0x200)
			return err
		},
		put("g", "1"), // 16
		put("g", "2"), // 17
	}
	after = []op{
		put("a", "3"),                // 18
		put("e", "2"),                // 19
		del("d"),                     // 20
		put("big2", big(2, 250_000)), // 21
		put("l1", "y", clientv3.WithLease(0x100)), // 22
		put("f", "1", clientv3.WithLease(0x300)),  // 23
		del("k", clientv3.WithPrefix()),           // 24
		put("g", "3"),                             // 25
	}
	return before, after, 16
}

func TestSnapshotRestoresInEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fdb, fdbURL := startFDBEtcd(t)
	refPeer := freePorts(t, 1)[0]
	ref, refURL := startEtcd(t, "ref", t.TempDir(), refPeer)

	before, after, compactAt := history()
	for _, cli := range []*clientv3.Client{fdb, ref} {
		for _, l := range []struct{ id, ttl int64 }{{0x100, 600}, {0x200, 900}, {0x300, 1200}} {
			if _, err := pb.NewLeaseClient(cli.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: l.id, TTL: l.ttl}); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(ops []op) {
		for i, o := range ops {
			for _, cli := range []*clientv3.Client{fdb, ref} {
				if err := o(ctx, cli); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
		}
	}
	run(before)
	for _, cli := range []*clientv3.Client{fdb, ref} {
		if _, err := cli.Compact(ctx, compactAt, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
	run(after)
	fdbRev := headerRev(ctx, t, fdb)
	if r := headerRev(ctx, t, ref); r != fdbRev {
		t.Fatalf("fdb-etcd at revision %d, etcd at %d after the same requests", fdbRev, r)
	}

	// Save both as etcdctl snapshot save does.
	dir := t.TempDir()
	fdbSnap, refSnap := filepath.Join(dir, "fdb.db"), filepath.Join(dir, "ref.db")
	lg := zap.NewNop()
	save(ctx, t, fdbURL, fdbSnap)
	save(ctx, t, refURL, refSnap)
	checkStream(ctx, t, fdb)

	// etcdutl snapshot status.
	fst, err := etcdutl.NewV3(lg).Status(fdbSnap)
	if err != nil {
		t.Fatalf("status of fdb-etcd's snapshot: %v", err)
	}
	rst, err := etcdutl.NewV3(lg).Status(refSnap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("status: fdb-etcd %+v, etcd %+v", fst, rst)
	if fst.Revision != fdbRev || fst.Revision != rst.Revision {
		t.Errorf("status revision: fdb-etcd %d, etcd %d, want %d", fst.Revision, rst.Revision, fdbRev)
	}
	live := countKeys(ctx, t, fdb)
	if fst.TotalKey != live || fst.TotalKey != rst.TotalKey {
		t.Errorf("status total keys: fdb-etcd %d, etcd %d, want %d", fst.TotalKey, rst.TotalKey, live)
	}
	if fst.Version != "3.6.0" {
		t.Errorf("status version %q", fst.Version)
	}

	// The databases themselves: the same buckets and schema keys as etcd's
	// own snapshot, the key bucket byte for byte, the same leases.
	compareDBs(t, stripChecksum(t, fdbSnap), stripChecksum(t, refSnap))

	// Restore fdb-etcd's snapshot with etcdutl and serve it with etcd.
	restored := restoreAndStart(t, fdbSnap)

	if r := headerRev(ctx, t, restored); r != fdbRev {
		t.Errorf("restored etcd at revision %d, fdb-etcd %d", r, fdbRev)
	}
	// Every retained revision reads the same, and the one below the
	// compaction is compacted on both.
	for rev := compactAt; rev <= fdbRev; rev++ {
		want := getAll(ctx, t, fdb, rev)
		got := getAll(ctx, t, restored, rev)
		if !slices.EqualFunc(want, got, func(a, b *mvccpb.KeyValue) bool { return a.String() == b.String() }) {
			t.Errorf("at revision %d:\nfdb-etcd %v\nrestored %v", rev, want, got)
		}
	}
	for name, cli := range map[string]*clientv3.Client{"fdb-etcd": fdb, "restored": restored} {
		if _, err := cli.Get(ctx, "a", clientv3.WithRev(compactAt-1)); !errors.Is(err, rpctypes.ErrCompacted) {
			t.Errorf("%s: Get at %d: %v, want %v", name, compactAt-1, err, rpctypes.ErrCompacted)
		}
	}
	// HashKV, compaction revision included.
	hashes := map[string]*clientv3.HashKVResponse{}
	for name, s := range map[string]struct {
		cli *clientv3.Client
		url string
	}{"fdb-etcd": {fdb, fdbURL}, "etcd": {ref, refURL}, "restored": {restored, restored.Endpoints()[0]}} {
		h, err := s.cli.HashKV(ctx, s.url, 0)
		if err != nil {
			t.Fatalf("%s HashKV: %v", name, err)
		}
		hashes[name] = h
	}
	t.Logf("HashKV: fdb-etcd %d/%d/%d etcd %d/%d/%d restored %d/%d/%d",
		hashes["fdb-etcd"].Hash, hashes["fdb-etcd"].CompactRevision, hashes["fdb-etcd"].HashRevision,
		hashes["etcd"].Hash, hashes["etcd"].CompactRevision, hashes["etcd"].HashRevision,
		hashes["restored"].Hash, hashes["restored"].CompactRevision, hashes["restored"].HashRevision)
	same := func(a, b *clientv3.HashKVResponse) bool {
		return a.Hash == b.Hash && a.CompactRevision == b.CompactRevision && a.HashRevision == b.HashRevision
	}
	t.Run("HashKV/restored=etcd", func(t *testing.T) {
		if !same(hashes["restored"], hashes["etcd"]) {
			t.Errorf("restored %v, etcd %v", hashes["restored"], hashes["etcd"])
		}
	})
	t.Run("HashKV/fdb-etcd=etcd", func(t *testing.T) {
		if !same(hashes["fdb-etcd"], hashes["etcd"]) {
			t.Errorf("fdb-etcd %v, etcd %v", hashes["fdb-etcd"], hashes["etcd"])
		}
	})
	if hashes["restored"].CompactRevision != compactAt {
		t.Errorf("restored compact revision %d, want %d", hashes["restored"].CompactRevision, compactAt)
	}
	// Leases: the same IDs, granted TTLs and keys.
	compareLeases(ctx, t, fdb, restored)
}

// restoreAndStart restores a snapshot with etcdutl and starts etcd on it.
func restoreAndStart(t *testing.T, snap string) *clientv3.Client {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restored.etcd")
	peer := freePorts(t, 1)[0]
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	if err := etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
		SnapshotPath:        snap,
		Name:                "restored",
		OutputDataDir:       dir,
		PeerURLs:            []string{peerURL},
		InitialCluster:      "restored=" + peerURL,
		InitialClusterToken: "snapshot-test",
	}); err != nil {
		t.Fatalf("restore: %v", err)
	}
	cli, _ := startEtcd(t, "restored", dir, peer)
	return cli
}

// save saves a snapshot as etcdctl snapshot save does and checks its version.
func save(ctx context.Context, t *testing.T, endpoint, path string) {
	t.Helper()
	ver, err := etcdutl.NewV3(zap.NewNop()).Save(ctx, clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second}, path)
	if err != nil {
		t.Fatalf("snapshot save from %s: %v", endpoint, err)
	}
	if ver != "3.6.0" {
		t.Errorf("snapshot from %s: version %q, want 3.6.0", endpoint, ver)
	}
}

func headerRev(ctx context.Context, t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	r, err := cli.Get(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func countKeys(ctx context.Context, t *testing.T, cli *clientv3.Client) int {
	t.Helper()
	r, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(r.Count)
}

func getAll(ctx context.Context, t *testing.T, cli *clientv3.Client, rev int64) []*mvccpb.KeyValue {
	t.Helper()
	r, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(rev))
	if err != nil {
		t.Fatalf("get at %d: %v", rev, err)
	}
	return r.Kvs
}

// checkStream reads the raw Snapshot stream: every message carries the
// storage version, RemainingBytes counts down to 0 over the database, and
// the last message is the sha256 of everything before it.
func checkStream(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	st, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Snapshot(ctx, &pb.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*pb.SnapshotResponse
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) < 2 {
		t.Fatalf("%d snapshot messages", len(msgs))
	}
	var db []byte
	for _, m := range msgs[:len(msgs)-1] {
		db = append(db, m.Blob...)
	}
	var total int
	for _, m := range msgs[:len(msgs)-1] {
		total += len(m.Blob)
	}
	sent := 0
	for i, m := range msgs {
		if m.Version != "3.6.0" {
			t.Fatalf("message %d: version %q", i, m.Version)
		}
		if i == len(msgs)-1 {
			break
		}
		sent += len(m.Blob)
		if m.RemainingBytes != uint64(total-sent) {
			t.Fatalf("message %d: remaining %d, want %d", i, m.RemainingBytes, total-sent)
		}
		if len(m.Blob) > 32*1024 {
			t.Fatalf("message %d: %d bytes", i, len(m.Blob))
		}
	}
	last := msgs[len(msgs)-1]
	sum := sha256.Sum256(db)
	if last.RemainingBytes != 0 || !bytes.Equal(last.Blob, sum[:]) {
		t.Fatalf("last message: remaining %d blob %x, want 0 and the sha256 %x", last.RemainingBytes, last.Blob, sum)
	}
}

// stripChecksum copies a saved snapshot without its sha256 trailer, so that
// bbolt can open it.
func stripChecksum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%512 != sha256.Size {
		t.Fatalf("%s: %d bytes, no checksum", path, len(b))
	}
	sum := sha256.Sum256(b[:len(b)-sha256.Size])
	if !bytes.Equal(sum[:], b[len(b)-sha256.Size:]) {
		t.Fatalf("%s: checksum mismatch", path)
	}
	out := path + ".bolt"
	if err := os.WriteFile(out, b[:len(b)-sha256.Size], 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

type bucketDump map[string]map[string][]byte

func dumpDB(t *testing.T, path string) bucketDump {
	t.Helper()
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := bucketDump{}
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			m := map[string][]byte{}
			d[string(name)] = m
			return b.ForEach(func(k, v []byte) error {
				m[string(k)] = bytes.Clone(v)
				return nil
			})
		})
	}); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// compareDBs compares fdb-etcd's database with the one of an etcd that was
// sent the same requests.
func compareDBs(t *testing.T, fdbPath, refPath string) {
	t.Helper()
	fdb, ref := dumpDB(t, fdbPath), dumpDB(t, refPath)
	if got, want := sortedKeys(fdb), sortedKeys(ref); !slices.Equal(got, want) {
		t.Errorf("buckets: fdb-etcd %q, etcd %q", got, want)
	}
	// Schema keys: the same names (values are per member or per process).
	for _, b := range []string{"meta", "cluster", "auth", "authUsers", "authRoles", "alarm", "members_removed"} {
		if got, want := sortedKeys(fdb[b]), sortedKeys(ref[b]); !slices.Equal(got, want) {
			t.Errorf("bucket %s keys: fdb-etcd %q, etcd %q", b, got, want)
		}
	}
	for _, kv := range []struct{ b, k string }{
		{"meta", "storageVersion"}, {"meta", "finishedCompactRev"}, {"meta", "scheduledCompactRev"},
		{"cluster", "clusterVersion"}, {"auth", "authEnabled"}, {"auth", "authRevision"},
	} {
		if got, want := fdb[kv.b][kv.k], ref[kv.b][kv.k]; !bytes.Equal(got, want) {
			t.Errorf("%s/%s: fdb-etcd %q, etcd %q", kv.b, kv.k, got, want)
		}
	}
	// The key bucket, byte for byte.
	fk, rk := fdb["key"], ref["key"]
	for _, k := range sortedKeys(rk) {
		if v, ok := fk[k]; !ok {
			t.Errorf("key bucket: fdb-etcd lacks %x (etcd: %.80x)", k, rk[k])
		} else if !bytes.Equal(v, rk[k]) {
			t.Errorf("key bucket %x: fdb-etcd %.80x, etcd %.80x", k, v, rk[k])
		}
	}
	for _, k := range sortedKeys(fk) {
		if _, ok := rk[k]; !ok {
			t.Errorf("key bucket: fdb-etcd has %x (%.80x) that etcd has not", k, fk[k])
		}
	}
	// Leases: the same IDs and TTLs (etcd records RemainingTTL only at
	// checkpoints; fdb-etcd records what is left).
	if got, want := sortedKeys(fdb["lease"]), sortedKeys(ref["lease"]); !slices.Equal(got, want) {
		t.Errorf("lease bucket: fdb-etcd %x, etcd %x", got, want)
	}
	for _, k := range sortedKeys(fdb["lease"]) {
		var f, r leasepb.Lease
		if err := f.Unmarshal(fdb["lease"][k]); err != nil {
			t.Fatalf("lease %x: %v", k, err)
		}
		if err := r.Unmarshal(ref["lease"][k]); err != nil {
			continue
		}
		if f.ID != r.ID || f.TTL != r.TTL || f.RemainingTTL <= 0 || f.RemainingTTL > f.TTL {
			t.Errorf("lease %x: fdb-etcd %v, etcd %v", k, &f, &r)
		}
	}
}

func compareLeases(ctx context.Context, t *testing.T, fdb, restored *clientv3.Client) {
	t.Helper()
	ids := func(cli *clientv3.Client) []int64 {
		r, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, l := range r.Leases {
			out = append(out, int64(l.ID))
		}
		slices.Sort(out)
		return out
	}
	want, got := ids(fdb), ids(restored)
	if !slices.Equal(want, got) {
		t.Fatalf("leases: fdb-etcd %x, restored %x", want, got)
	}
	for _, id := range want {
		w, err := fdb.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		g, err := restored.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		keys := func(r *clientv3.LeaseTimeToLiveResponse) string {
			var ks []string
			for _, k := range r.Keys {
				ks = append(ks, string(k))
			}
			slices.Sort(ks)
			return strings.Join(ks, ",")
		}
		if w.GrantedTTL != g.GrantedTTL || keys(w) != keys(g) || g.TTL <= 0 || g.TTL > w.TTL+2 || g.TTL < w.TTL-30 {
			t.Errorf("lease %x: fdb-etcd granted %d ttl %d keys %s; restored granted %d ttl %d keys %s",
				id, w.GrantedTTL, w.TTL, keys(w), g.GrantedTTL, g.TTL, keys(g))
		}
	}
}
