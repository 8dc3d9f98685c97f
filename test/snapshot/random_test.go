package snapshot

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSnapshotRandomMatchesEtcd sends the same random writes, lease
// operations and compactions to fdb-etcd and to etcd, then requires
// fdb-etcd's snapshot to hold etcd's key bucket byte for byte, the same
// HashKV at every retained revision, and an etcd restored from it to read
// every retained revision as fdb-etcd does.
func TestSnapshotRandomMatchesEtcd(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomRun(t, seed) })
	}
}

func randomRun(t *testing.T, seed uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fdb, fdbURL := startFDBEtcd(t)
	ref, refURL := startEtcd(t, "ref", t.TempDir(), freePorts(t, 1)[0])
	both := []*clientv3.Client{fdb, ref}

	rnd := mrand.New(mrand.NewPCG(seed, 42))
	keys := []string{"a", "a/1", "a/2", "b", "c", "c\x00d", "d\xff", "e"}
	key := func() string { return keys[rnd.IntN(len(keys))] }
	val := func() string {
		if rnd.IntN(25) == 0 {
			return string(make([]byte, 100_000+rnd.IntN(150_000)))
		}
		return fmt.Sprint("v", rnd.IntN(1000))
	}
	leases := []int64{}
	nextLease := int64(0x1000)
	for i := 0; i < 250; i++ {
		var o func(cli *clientv3.Client) error
		switch n := rnd.IntN(20); {
		case n < 8:
			k, v := key(), val()
			var opts []clientv3.OpOption
			if len(leases) > 0 && rnd.IntN(4) == 0 {
				opts = append(opts, clientv3.WithLease(clientv3.LeaseID(leases[rnd.IntN(len(leases))])))
			}
			o = func(cli *clientv3.Client) error { _, err := cli.Put(ctx, k, v, opts...); return err }
		case n < 11:
			k := key()
			var opts []clientv3.OpOption
			if rnd.IntN(3) == 0 {
				opts = append(opts, clientv3.WithPrefix())
			}
			o = func(cli *clientv3.Client) error { _, err := cli.Delete(ctx, k, opts...); return err }
		case n < 14:
			k1, k2, k3 := key(), key(), key()
			if k1 == k2 || k2 == k3 || k1 == k3 {
				continue
			}
			v := val()
			o = func(cli *clientv3.Client) error {
				_, err := cli.Txn(ctx).Then(clientv3.OpPut(k1, v), clientv3.OpDelete(k2), clientv3.OpPut(k3, v)).Commit()
				return err
			}
		case n < 16:
			id := nextLease
			nextLease++
			leases = append(leases, id)
			o = func(cli *clientv3.Client) error {
				_, err := pb.NewLeaseClient(cli.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: 600 + id%100})
				return err
			}
		case n < 17:
			if len(leases) == 0 {
				continue
			}
			j := rnd.IntN(len(leases))
			id := leases[j]
			leases = slices.Delete(leases, j, j+1)
			o = func(cli *clientv3.Client) error { _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); return err }
		default:
			r, err := fdb.Get(ctx, "probe")
			if err != nil {
				t.Fatal(err)
			}
			h, err := fdb.HashKV(ctx, fdbURL, 0)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := h.CompactRevision+1, r.Header.Revision
			if lo > hi || rnd.IntN(3) != 0 {
				continue
			}
			rev := lo + rnd.Int64N(hi-lo+1)
			o = func(cli *clientv3.Client) error {
				_, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
				return err
			}
		}
		var errs [2]error
		for j, cli := range both {
			errs[j] = o(cli)
		}
		if (errs[0] == nil) != (errs[1] == nil) {
			t.Fatalf("op %d: fdb-etcd %v, etcd %v", i, errs[0], errs[1])
		}
	}
	rev := headerRev(ctx, t, fdb)
	if r := headerRev(ctx, t, ref); r != rev {
		t.Fatalf("fdb-etcd at %d, etcd at %d", rev, r)
	}
	dir := t.TempDir()
	fdbSnap, refSnap := filepath.Join(dir, "fdb.db"), filepath.Join(dir, "ref.db")
	save(ctx, t, fdbURL, fdbSnap)
	save(ctx, t, refURL, refSnap)
	compareDBs(t, stripChecksum(t, fdbSnap), stripChecksum(t, refSnap))
	restored := restoreAndStart(t, fdbSnap)

	h, err := fdb.HashKV(ctx, fdbURL, 0)
	if err != nil {
		t.Fatal(err)
	}
	compacted := h.CompactRevision
	t.Logf("revision %d, compacted %d", rev, compacted)
	type row struct {
		rev                     int64
		fdbEtcd, etcd, restored string
	}
	var rows []row
	for r := max(compacted, 1); r <= rev; r++ {
		var got []string
		for _, s := range []struct {
			cli *clientv3.Client
			url string
		}{{fdb, fdbURL}, {ref, refURL}, {restored, restored.Endpoints()[0]}} {
			h, err := s.cli.HashKV(ctx, s.url, r)
			if err != nil {
				t.Fatalf("HashKV at %d: %v", r, err)
			}
			got = append(got, fmt.Sprintf("%d/%d/%d", h.Hash, h.CompactRevision, h.HashRevision))
		}
		// etcd answers HashKV at its compaction revision with the hash it
		// computed while compacting (from the previous compaction on); an
		// etcd restored from a snapshot, like fdb-etcd, hashes afresh.
		if r == compacted {
			got[1] = got[2]
		}
		rows = append(rows, row{r, got[0], got[1], got[2]})
		want, have := getAll(ctx, t, fdb, r), getAll(ctx, t, restored, r)
		if !slices.EqualFunc(want, have, func(a, b *mvccpb.KeyValue) bool { return a.String() == b.String() }) {
			t.Errorf("at revision %d: fdb-etcd and the restored etcd differ", r)
		}
	}
	// The snapshot's fidelity: the restored etcd hashes as etcd does.
	t.Run("HashKV/restored=etcd", func(t *testing.T) {
		for _, r := range rows {
			if r.restored != r.etcd {
				t.Errorf("HashKV at %d: restored %s, etcd %s", r.rev, r.restored, r.etcd)
			}
		}
	})
	// fdb-etcd's own HashKV.
	t.Run("HashKV/fdb-etcd=etcd", func(t *testing.T) {
		for _, r := range rows {
			if r.fdbEtcd != r.etcd {
				t.Errorf("HashKV at %d: fdb-etcd %s, etcd %s", r.rev, r.fdbEtcd, r.etcd)
			}
		}
	})
	compareLeases(ctx, t, fdb, restored)
}
