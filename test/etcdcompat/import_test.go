package etcdcompat

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// importWorkload writes, on etcd, a history with every shape an import must
// carry: multi-version keys, values larger than one stored chunk, txns of
// several changes, single and range deletes, leases with keys (one revoked,
// one whose key is detached), a key deleted before the compaction (which the
// compaction drops), a key deleted at the compaction revision (whose
// tombstone it keeps), and writes after the compaction. It returns the
// compaction revision.
func importWorkload(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	big := func(n int, c byte) string { return strings.Repeat(string(c), n) }
	for _, k := range []string{"a", "b", "c"} {
		must(cli.Put(ctx, k, "1"))
	}
	must(cli.Put(ctx, "d", big(300_000, 'd')))
	must(cli.Put(ctx, "a", "2"))
	must(cli.Txn(ctx).Then(clientv3.OpPut("e", "1"), clientv3.OpPut("f", "1"), clientv3.OpDelete("c")).Commit())
	must(cli.Delete(ctx, "b"))
	l1, err := cli.Grant(ctx, 600)
	must(l1, err)
	must(cli.Put(ctx, "l1/x", "x", clientv3.WithLease(l1.ID)))
	must(cli.Put(ctx, "l1/y", "y", clientv3.WithLease(l1.ID)))
	l2, err := cli.Grant(ctx, 300)
	must(l2, err)
	must(cli.Put(ctx, "l2/x", "x", clientv3.WithLease(l2.ID)))
	must(cli.Put(ctx, "l2/y", "y", clientv3.WithLease(l2.ID)))
	must(cli.Revoke(ctx, l2.ID))
	l3, err := cli.Grant(ctx, 900)
	must(l3, err)
	must(cli.Put(ctx, "l3/x", "x", clientv3.WithLease(l3.ID)))
	must(cli.Put(ctx, "l3/x", "x2"))
	must(cli.Put(ctx, "g", "1"))
	must(cli.Delete(ctx, "g"))
	must(cli.Put(ctx, "h", "1"))
	del, err := cli.Delete(ctx, "h")
	must(del, err)
	compactRev := del.Header.Revision
	must(cli.Compact(ctx, compactRev, clientv3.WithCompactPhysical()))
	must(cli.Put(ctx, "a", "3"))
	must(cli.Delete(ctx, "e"))
	must(cli.Txn(ctx).Then(clientv3.OpPut("i", "1"), clientv3.OpPut("d", "small"), clientv3.OpDelete("f", clientv3.WithRange("g"))).Commit())
	must(cli.Put(ctx, "h", "2"))
	must(cli.Put(ctx, "l1/z", big(150_000, 'z'), clientv3.WithLease(l1.ID)))
	must(cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("a"), "=", 3)).
		Then(clientv3.OpPut("a", "4"), clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut("j", "1")}, nil)).Commit())
	must(cli.Delete(ctx, "l3/", clientv3.WithPrefix()))
	must(cli.Put(ctx, "l1/x", "again", clientv3.WithLease(l1.ID)))
	return compactRev
}

// saveSnapshot writes etcd's Maintenance.Snapshot stream (the database and
// its SHA-256, what `etcdctl snapshot save` writes) to a file.
func saveSnapshot(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "snapshot.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// runImport runs `fdb-etcd import` into store and returns its output.
func runImport(t *testing.T, store *candStore, snapshot string) (string, error) {
	t.Helper()
	if fdbBuildErr != nil {
		t.Fatalf("fdb-etcd is not available:\n%v", fdbBuildErr)
	}
	args := append([]string{"import", "--snapshot", snapshot}, store.args()...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, fdbBinary, args...).CombinedOutput()
	return string(out), err
}

// refStarter starts a reference etcd on dir, with client and peer ports.
type refStarter func(t *testing.T, dir string, cport, pport int) (*server, func(), error)

func startEmbeddedOn(t *testing.T, dir string, cport, pport int) (*server, func(), error) {
	return startEmbedded(t, "etcd", cport, pport, pairOptions{etcdDir: dir})
}

// startImportPair starts a reference etcd with importWorkload's history,
// imports its snapshot into a fresh store (checking on the way that a
// corrupt snapshot is refused without changing the store, and that a second
// import into the loaded store is refused), and serves that store.
func startImportPair(t *testing.T, start refStarter) (p *pair, compactRev int64, imported time.Time) {
	t.Helper()
	if candidateKind != "fdb-etcd" {
		t.Skip("imports into fdb-etcd only")
	}
	ports, err := freePorts(t, 3)
	if err != nil {
		t.Fatal(err)
	}
	etcdDir := t.TempDir()
	ref, stopRef, err := start(t, etcdDir, ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	compactRev = importWorkload(t, ref.cli)
	snap := saveSnapshot(t, ref.cli)
	// The reference restarts on its data: as an etcd restored from the
	// snapshot, it has forgotten the hash it computed when it compacted
	// (etcd answers HashKV at a compaction revision from that memory while
	// it runs) and computes every HashKV from its data.
	stopRef()
	ref, stopRef, err = start(t, etcdDir, ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopRef)

	store := newCandStore(t)
	corrupt := filepath.Join(t.TempDir(), "corrupt.db")
	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(corrupt, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runImport(t, store, corrupt); err == nil || !strings.Contains(out, "hash mismatch") {
		t.Fatalf("import of a corrupt snapshot: %v, want a hash mismatch; output:\n%s", err, out)
	}
	imported = time.Now()
	if out, err := runImport(t, store, snap); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	} else {
		t.Logf("import output:\n%s", out)
	}
	if out, err := runImport(t, store, snap); err == nil || !strings.Contains(out, "not empty") {
		t.Fatalf("second import into the loaded store: %v, want a refusal; output:\n%s", err, out)
	}
	cand, stopCand, err := startFDBEtcd(t, ports[2], pairOptions{store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopCand)
	return &pair{ref: ref, cand: cand}, compactRev, imported
}

// TestImportSnapshotCompat imports a snapshot of a real etcd and compares
// what both answer: full Ranges at every revision the snapshot retains and
// around it, Watch from past revisions, HashKV at several revisions, the
// leases and their keys, and the writes that follow.
func TestImportSnapshotCompat(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	testImportSnapshot(t, startEmbeddedOn)
}

func testImportSnapshot(t *testing.T, start refStarter) {
	p, compactRev, imported := startImportPair(t, start)
	head := p.refRev(t)
	t.Logf("etcd at revision %d, compacted at %d", head, compactRev)
	if resp, err := p.cand.do(allRange(0)); err != nil || headerRev(resp) != head {
		t.Fatalf("imported store at revision %d (%v), etcd at %d", headerRev(resp), err, head)
	}
	for rev := compactRev - 1; rev <= head+1; rev++ {
		p.check(t, fmt.Sprintf("full range at revision %d", rev), allRange(rev))
		p.check(t, fmt.Sprintf("count at revision %d", rev), &pb.RangeRequest{Key: []byte("l"), RangeEnd: []byte("m"), Revision: rev, CountOnly: true})
	}
	checkImportedHashes(t, p, compactRev, head)
	checkImportedWatches(t, p, compactRev, head)
	checkImportedLeases(t, p, imported)

	// The store goes on from there as etcd does.
	p.check(t, "put after import", &pb.PutRequest{Key: []byte("a"), Value: []byte("5"), PrevKv: true})
	p.check(t, "txn after import", &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{
		RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte("e"), PrevKv: true}}}}})
	p.check(t, "compact after import", &pb.CompactionRequest{Revision: head})
	for _, rev := range []int64{0, head + 1, head + 2} {
		checkHashKV(t, p, rev)
	}
	if d := p.stateDiff(); d != "" {
		t.Error(d)
	}
}

func checkImportedHashes(t *testing.T, p *pair, compactRev, head int64) {
	t.Helper()
	for _, rev := range []int64{0, compactRev - 1, compactRev, compactRev + 1, (compactRev + head) / 2, head, head + 1} {
		checkHashKV(t, p, rev)
	}
}

func checkHashKV(t *testing.T, p *pair, rev int64) {
	t.Helper()
	var (
		out  [2]string
		resp [2]*pb.HashKVResponse
	)
	for i, s := range []*server{p.ref, p.cand} {
		ctx, cancel := ctxOp()
		r, err := s.maint.HashKV(ctx, &pb.HashKVRequest{Revision: rev})
		cancel()
		if err != nil {
			out[i] = errStr(err)
			continue
		}
		resp[i] = r
	}
	for i, r := range resp {
		if r == nil {
			continue
		}
		hashRev := r.HashRevision
		if resp[0] != nil && resp[0].HashRevision == 0 {
			hashRev = 0 // etcd 3.5 does not report it
		}
		out[i] = fmt.Sprintf("hash=%d hash_revision=%d compact_revision=%d header_revision=%d", r.Hash, hashRev, r.CompactRevision, r.Header.Revision)
	}
	if out[0] != out[1] {
		t.Errorf("HashKV at revision %d:\n  etcd:     %s\n  fdb-etcd: %s", rev, out[0], out[1])
	}
}

// checkImportedWatches compares watches of every key from revisions
// around the compaction up to head: each is read until its event at head
// arrives (or its compaction cancels it), so that a slow machine cannot cut
// one short, and the events, with and without prev_kv, must be the same.
func checkImportedWatches(t *testing.T, p *pair, compactRev, head int64) {
	t.Helper()
	for _, start := range []int64{compactRev - 1, compactRev, compactRev + 1, (compactRev + head) / 2, head} {
		for _, prevKV := range []bool{false, true} {
			ref := watchUntil(t, p.ref, start, head, prevKV)
			cand := watchUntil(t, p.cand, start, head, prevKV)
			if ref != cand {
				t.Errorf("watch from %d (prev_kv %v):\n  etcd:     %s\n  fdb-etcd: %s\n  note:     %s", start, prevKV, ref, cand, diffHint(ref, cand))
			}
		}
	}
}

// watchUntil renders the events of a watch of every key from start up to
// revision head, or how it was cancelled.
func watchUntil(t *testing.T, s *server, start, head int64, prevKV bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithFromKey(), clientv3.WithRev(start)}
	if prevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	var b strings.Builder
	for resp := range s.cli.Watch(ctx, "\x00", opts...) {
		if err := resp.Err(); err != nil {
			fmt.Fprintf(&b, "canceled compact_revision=%d: %v", resp.CompactRevision, err)
			return b.String()
		}
		for _, ev := range resp.Events {
			fmt.Fprintf(&b, "%s; ", eventStr((*mvccpb.Event)(ev)))
			if ev.Kv.ModRevision == head {
				return b.String()
			}
		}
	}
	t.Fatalf("%s: watch from %d did not reach revision %d within 60s; got %s", s.name, start, head, b.String())
	return ""
}

func checkImportedLeases(t *testing.T, p *pair, imported time.Time) {
	t.Helper()
	ctx, cancel := ctxOp()
	defer cancel()
	refLeases, err := p.ref.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	candLeases, err := p.cand.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ls := range [][]*pb.LeaseStatus{refLeases.Leases, candLeases.Leases} {
		sort.Slice(ls, func(i, j int) bool { return ls[i].ID < ls[j].ID })
	}
	if fmt.Sprint(refLeases.Leases) != fmt.Sprint(candLeases.Leases) {
		t.Errorf("leases: etcd %v, fdb-etcd %v", refLeases.Leases, candLeases.Leases)
	}
	for _, l := range refLeases.Leases {
		var got [2]*pb.LeaseTimeToLiveResponse
		for i, s := range []*server{p.ref, p.cand} {
			r, err := s.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: l.ID, Keys: true})
			if err != nil {
				t.Fatalf("%s: TimeToLive(%x): %v", s.name, l.ID, err)
			}
			got[i] = r
		}
		for _, r := range got {
			sort.Slice(r.Keys, func(i, j int) bool { return bytes.Compare(r.Keys[i], r.Keys[j]) < 0 })
		}
		if got[0].GrantedTTL != got[1].GrantedTTL || !bytes.Equal(bytes.Join(got[0].Keys, []byte(",")), bytes.Join(got[1].Keys, []byte(","))) {
			t.Errorf("lease %x: etcd granted %d keys %q, fdb-etcd granted %d keys %q", l.ID, got[0].GrantedTTL, got[0].Keys, got[1].GrantedTTL, got[1].Keys)
		}
		// etcd's restore gives a lease without a checkpoint its whole TTL
		// again; the import does the same, counted from the import, which
		// began at imported (the checks before this one take a minute or
		// more on a loaded machine). 2 s for TTLs in whole seconds.
		since := int64(time.Since(imported).Seconds()) + 2
		if ttl := got[1].TTL; ttl > got[1].GrantedTTL || ttl < got[1].GrantedTTL-since {
			t.Errorf("lease %x: %d s left of %d, %d s after the import began", l.ID, ttl, got[1].GrantedTTL, since-2)
		}
	}
	// Revoking a lease deletes the same keys in one revision on both.
	for _, l := range refLeases.Leases {
		for _, s := range []*server{p.ref, p.cand} {
			if _, err := s.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: l.ID}); err != nil {
				t.Fatalf("%s: revoke %x: %v", s.name, l.ID, err)
			}
		}
		if d := p.stateDiff(); d != "" {
			t.Errorf("after revoking lease %x: %s", l.ID, d)
		}
	}
}
