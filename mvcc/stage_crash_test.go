package mvcc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// commitProbe calls after once each Update has committed.
type commitProbe struct {
	storage.DB
	mu    sync.Mutex
	after func()
}

func (p *commitProbe) Update(ctx context.Context, fn func(storage.Tx) error) error {
	err := p.DB.Update(ctx, fn)
	p.mu.Lock()
	after := p.after
	p.mu.Unlock()
	if err == nil && after != nil {
		after()
	}
	return err
}

// TestCrashWhileStaging takes a crash image of the disk after every commit
// of a staged DeleteRange and a staged lease revoke: reservations, staging
// transactions, beats, publications. Every image reopens consistent, and
// reads the range and the lease's keys either whole or gone — never a part.
// A reservation the crash left pending is finished: at once when the store
// is opened as the storage's sole writer, else by the first write, once the
// beat has stood still; either way the request then took its revision whole.
func TestCrashWhileStaging(t *testing.T) {
	testdb.PebbleOnly(t)
	const n = 1000
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	db, err := pebble.Open("db", pebble.Options{FS: fs, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	probe := &commitProbe{DB: db}
	s, err := Open(probe, Config{StageBytes: 4 << 10, StageChunkBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	grantLease(t, probe, 9)
	fill(t, s, "c/", n, 0)
	fill(t, s, "l/", 3*n, 9) // every third on the lease: n keys
	var mu sync.Mutex
	var images []*vfs.MemFS
	probe.mu.Lock()
	probe.after = func() {
		img := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		mu.Lock()
		images = append(images, img)
		mu.Unlock()
	}
	probe.mu.Unlock()
	d, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("c/"), RangeEnd: []byte("c0")})
	if err != nil || d.Deleted != n {
		t.Fatalf("delete: %v, %v", d, err)
	}
	v, err := s.Revoke(ctx, &RevokeRequest{ID: 9})
	if err != nil || v.Header.Revision != d.Header.Revision+1 {
		t.Fatalf("revoke: %v, %v", v, err)
	}
	probe.mu.Lock()
	probe.after = nil
	probe.mu.Unlock()
	s.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !isStagedFS(t, fs, d.Header.Revision) || !isStagedFS(t, fs, v.Header.Revision) {
		t.Fatal("the delete and the revoke were not staged")
	}
	t.Logf("%d crash images taken", len(images))
	// Reopening an image is 40 times slower under the race detector (all
	// 28: 4 s without it, 120-180 s with it), so a race build checks every
	// fifth and the last, even and odd ones (opened as the sole writer or
	// not); make test runs this test without it too, on every image.
	stride := 1
	if RaceBuild {
		stride = 5
	}
	pendingSeen, checked := 0, 0
	for i, img := range images {
		if i%stride != 0 && i != len(images)-1 {
			continue
		}
		checked++
		if checkStagingImage(t, fmt.Sprintf("image %d of %d", i, len(images)), img, n, d.Header.Revision, i%2 == 0) {
			pendingSeen++
		}
	}
	if pendingSeen == 0 {
		t.Fatal("no image caught a reservation pending")
	}
	t.Logf("%d of %d crash images checked, %d with a reservation pending", checked, len(images), pendingSeen)
}

func isStagedFS(t *testing.T, fs *vfs.MemFS, rev int64) bool {
	db, err := pebble.Open("db", pebble.Options{FS: fs, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return isStaged(t, db, rev)
}

// checkStagingImage reopens one crash image and checks it; it reports
// whether the image had a reservation pending. delRev is the revision the
// DeleteRange took (the revoke took the next).
func checkStagingImage(t *testing.T, name string, img *vfs.MemFS, n int, delRev int64, sole bool) bool {
	t.Helper()
	ctx := context.Background()
	db, err := pebble.Open("db", pebble.Options{FS: img, CacheBytes: 8 << 20})
	if err != nil {
		t.Fatalf("%s: reopen: %v", name, err)
	}
	defer db.Close()
	head, _, err := checkStoreConsistent(db)
	if err != nil {
		t.Fatalf("%s: inconsistent: %v", name, err)
	}
	var pending []byte
	if err := db.View(ctx, func(tx storage.ReadTx) error {
		pending, err = tx.Get(keyspace.Pending)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, Config{SoleWriter: sole, Sequencer: revision.Config{BeatInterval: 10 * time.Millisecond, BeatTimeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatalf("%s: open: %v", name, err)
	}
	defer s.Close()
	if sole {
		head, _, err = s.Rev(ctx) // a pending reservation was finished by Open
		if err != nil {
			t.Fatal(err)
		}
	}
	checkWholeOrGone(t, name+" (reopened)", s, n, head, delRev)
	if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte("after"), Value: []byte("x")}); err != nil {
		t.Fatalf("%s: put after reopen: %v", name, err)
	}
	head, _, err = s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkWholeOrGone(t, name+" (written to)", s, n, head-1, delRev)
	if _, _, err := checkStoreConsistent(db); err != nil {
		t.Fatalf("%s: inconsistent after the first write: %v", name, err)
	}
	return pending != nil
}

// checkWholeOrGone: at head, the range is whole before delRev and gone
// from it on, and the lease's keys likewise around delRev+1.
func checkWholeOrGone(t *testing.T, name string, s *Store, n int, head, delRev int64) {
	t.Helper()
	ctx := context.Background()
	for _, c := range []struct {
		prefix string
		rev    int64
	}{{"c/", delRev}, {"l/", delRev + 1}} {
		r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(c.prefix), RangeEnd: []byte(c.prefix[:1] + "0"), CountOnly: true})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		all := int64(n)
		if c.prefix == "l/" {
			all = 3 * int64(n)
		}
		want := all
		if head >= c.rev {
			want = all - int64(n)
		}
		if r.Count != want {
			t.Fatalf("%s: %d keys under %s at head %d, want %d (the request took revision %d)", name, r.Count, c.prefix, head, want, c.rev)
		}
		if head < c.rev {
			continue
		}
		evs, err := revisionEvents(ctx, s, c.rev)
		if err != nil || len(evs) != 1 || len(evs[0].Events) != n {
			t.Fatalf("%s: revision %d: %d revisions read (%v), want its %d events; %s\n%s", name, c.rev, len(evs), err, n, describeEvents(evs), describeParts(t, s.db, c.rev))
		}
	}
}

func describeEvents(evs []RevisionEvents) string {
	var out []string
	for _, re := range evs {
		first, last := "", ""
		if len(re.Events) > 0 {
			first, last = string(re.Events[0].Kv.Key), string(re.Events[len(re.Events)-1].Kv.Key)
		}
		out = append(out, fmt.Sprintf("rev %d: %d events %s..%s", re.Rev, len(re.Events), first, last))
	}
	return fmt.Sprint(out)
}

func describeParts(t *testing.T, db storage.DB, rev int64) string {
	var out []string
	_ = db.View(context.Background(), func(tx storage.ReadTx) error {
		parts, err := tx.GetRange(keyspace.LogFrom(rev), keyspace.LogFrom(rev+1), storage.RangeOptions{})
		for _, p := range parts {
			_, part, _ := keyspace.ParseLog(p.Key)
			evs, _ := decodeLogPart(p.Value, part == 0)
			first, last := "", ""
			if len(evs) > 0 {
				first, last = string(evs[0].Key), string(evs[len(evs)-1].Key)
			}
			out = append(out, fmt.Sprintf("part %d: %d events %s..%s sub %v", part, len(evs), first, last, func() []int64 {
				var subs []int64
				for _, e := range evs {
					subs = append(subs, e.Sub)
				}
				if len(subs) > 3 {
					subs = subs[:3]
				}
				return subs
			}()))
		}
		return err
	})
	return fmt.Sprint(out)
}
