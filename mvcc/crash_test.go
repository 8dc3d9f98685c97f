package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
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

// ack is one write the store acknowledged: the revision it took and what
// it changed there (value nil: deleted).
type ack struct {
	rev  int64
	keys []string
	vals [][]byte
}

// crashImage is a simulated crash: the filesystem as it could be found after
// a power loss at that moment, and the writes acknowledged before it.
type crashImage struct {
	fs        *vfs.MemFS
	acked     []ack
	unsynced  int
	takenAtMs int64
}

// TestCrashConsistency runs concurrent, group-committed mvcc writes (puts,
// chunked values, deletes, multi-key txns) and compactions on Pebble's
// crash-simulating filesystem, takes crash images at random moments (with
// none, some or all unsynced data surviving), and reopens each: the store
// must be consistent (dense revision log, history, latest index, chunks) and
// hold every acknowledged revision exactly as acknowledged.
func TestCrashConsistency(t *testing.T) {
	testdb.PebbleOnly(t)
	seeds := []uint64{1}
	if os.Getenv("ROBUSTNESS_LONG") != "" { // make robustness
		seeds = []uint64{1, 2, 3, 4, 5, 6}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			images := crashWorkload(t, seed, 6, false)
			for i, img := range images {
				if err := checkCrashImage(t, fmt.Sprintf("image %d (%d ms, unsynced %d%%)", i, img.takenAtMs, img.unsynced), img); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestCrashConsistencyControl: the same crashes with the WAL fsync off must
// lose acknowledged writes, or the simulation above proves nothing.
func TestCrashConsistencyControl(t *testing.T) {
	testdb.PebbleOnly(t)
	images := crashWorkload(t, 7, 3, true)
	for i, img := range images {
		if err := checkCrashImage(t, fmt.Sprint("image ", i), img); err != nil {
			t.Logf("without fsync the crash check fails as it must: %v", err)
			return
		}
	}
	t.Fatal("no crash image lost an acknowledged write without fsync: the check is vacuous")
}

func crashWorkload(t *testing.T, seed uint64, nImages int, noSync bool) []crashImage {
	fs := vfs.NewCrashableMem()
	db, err := pebble.Open("db", pebble.Options{FS: fs, CacheBytes: 8 << 20, NoSync: noSync})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, Config{CompactionBatch: 16, Sequencer: revision.Config{MaxBatch: 64}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu    sync.Mutex
		acked []ack
		wg    sync.WaitGroup
	)
	record := func(a ack) {
		mu.Lock()
		acked = append(acked, a)
		mu.Unlock()
	}
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("k%d", rnd.IntN(40))
				val := fmt.Appendf(nil, "w%d-%d", w, i)
				if rnd.IntN(25) == 0 {
					big := make([]byte, 100_000+rnd.IntN(250_000)) // several chunks
					copy(big, val)
					val = big
				}
				switch rnd.IntN(6) {
				case 0:
					r, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(k)})
					if err == nil && r.Deleted > 0 {
						record(ack{rev: r.Header.Revision, keys: []string{k}, vals: [][]byte{nil}})
					}
				case 1:
					k2 := fmt.Sprintf("k%d", 40+rnd.IntN(40))
					r, err := s.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{
						{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: val}}},
						{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k2), Value: val}}},
					}})
					if err == nil {
						record(ack{rev: r.Header.Revision, keys: []string{k, k2}, vals: [][]byte{val, val}})
					}
				default:
					r, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: val})
					if err == nil {
						record(ack{rev: r.Header.Revision, keys: []string{k}, vals: [][]byte{val}})
					}
				}
			}
		}(w)
	}
	wg.Add(1)
	go func() { // compaction under the writes
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			head, _, err := s.Rev(ctx)
			if err == nil && head > 300 {
				_, _ = s.Compact(ctx, &pb.CompactionRequest{Revision: head - 200})
			}
		}
	}()
	rnd := rand.New(rand.NewPCG(seed, 99))
	start := time.Now()
	var images []crashImage
	for len(images) < nImages {
		time.Sleep(time.Duration(20+rnd.IntN(150)) * time.Millisecond)
		mu.Lock()
		snapshot := append([]ack(nil), acked...)
		mu.Unlock()
		pct := []int{0, 30, 100}[rnd.IntN(3)]
		if noSync {
			pct = 0
		}
		cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
		if pct > 0 {
			cfg.RNG = rand.New(rand.NewPCG(seed, uint64(len(images))))
		}
		images = append(images, crashImage{fs: fs.CrashClone(cfg), acked: snapshot, unsynced: pct, takenAtMs: time.Since(start).Milliseconds()})
	}
	cancel()
	wg.Wait()
	s.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return images
}

func checkCrashImage(t *testing.T, name string, img crashImage) error {
	t.Helper()
	db, err := pebble.Open("db", pebble.Options{FS: img.fs, CacheBytes: 8 << 20})
	if err != nil {
		return fmt.Errorf("%s: reopen: %v", name, err)
	}
	defer db.Close()
	s, err := Open(db, Config{})
	if err != nil {
		return fmt.Errorf("%s: mvcc reopen: %v", name, err)
	}
	defer s.Close()
	ctx := context.Background()
	head, c, err := checkStoreConsistent(db)
	if err != nil {
		return fmt.Errorf("%s: inconsistent after crash: %w", name, err)
	}

	// Every acknowledged revision is there, as acknowledged.
	var maxAck int64
	byRev := map[int64]ack{}
	for _, a := range img.acked {
		if _, dup := byRev[a.rev]; dup {
			return fmt.Errorf("%s: revision %d acknowledged twice", name, a.rev)
		}
		byRev[a.rev] = a
		maxAck = max(maxAck, a.rev)
	}
	if head < maxAck {
		return fmt.Errorf("%s: head %d after the crash, but revision %d was acknowledged", name, head, maxAck)
	}
	checked := 0
	for rev, a := range byRev {
		if rev < c.Requested {
			continue // compacted: only its survival in later state is visible
		}
		evs, err := revisionEvents(ctx, s, rev)
		if err != nil {
			return fmt.Errorf("%s: revisionEvents(%d): %v", name, rev, err)
		}
		if len(evs) != 1 || evs[0].Rev != rev || len(evs[0].Events) != len(a.keys) {
			return fmt.Errorf("%s: acknowledged revision %d (%v) reads back as %v", name, rev, a.keys, evs)
		}
		for i, ev := range evs[0].Events {
			if string(ev.Kv.Key) != a.keys[i] || (a.vals[i] == nil) != (ev.Type == 1) || a.vals[i] != nil && !bytes.Equal(ev.Kv.Value, a.vals[i]) {
				return fmt.Errorf("%s: acknowledged revision %d event %d: got %s type %v (%d bytes), want %s (%d bytes)",
					name, rev, i, ev.Kv.Key, ev.Type, len(ev.Kv.Value), a.keys[i], len(a.vals[i]))
			}
		}
		checked++
	}
	// Compacted or not, each key's newest acknowledged write is still its
	// state, unless a newer write (acknowledged or in flight) replaced it.
	newest := map[string]struct {
		rev int64
		val []byte
	}{}
	for _, a := range img.acked {
		for i, k := range a.keys {
			if a.rev > newest[k].rev {
				newest[k] = struct {
					rev int64
					val []byte
				}{a.rev, a.vals[i]}
			}
		}
	}
	for k, w := range newest {
		var m meta
		err := db.View(ctx, func(tx storage.ReadTx) error {
			v, err := tx.Get(keyspace.Latest([]byte(k)))
			if err != nil || v == nil {
				m = meta{}
				return err
			}
			m, err = decodeMeta(v)
			return err
		})
		if err != nil {
			return err
		}
		switch {
		case m.ModRev == 0 && w.val == nil:
			// deleted, and the tombstone compacted away
		case m.ModRev < w.rev:
			return fmt.Errorf("%s: %q acknowledged at revision %d, latest after the crash is revision %d", name, k, w.rev, m.ModRev)
		case m.ModRev == w.rev && m.Tombstone != (w.val == nil):
			return fmt.Errorf("%s: %q acknowledged at revision %d (delete %v), latest tombstone %v", name, k, w.rev, w.val == nil, m.Tombstone)
		case m.ModRev == w.rev && w.val != nil:
			r, err := s.Range(ctx, &pb.RangeRequest{Key: []byte(k)})
			if err != nil {
				return err
			}
			if len(r.Kvs) != 1 || !bytes.Equal(r.Kvs[0].Value, w.val) {
				return fmt.Errorf("%s: %q acknowledged at revision %d reads back wrong", name, k, w.rev)
			}
		}
	}
	// Writes continue where the log ends: no revision reused.
	r, err := s.Put(ctx, &pb.PutRequest{Key: []byte("after-crash"), Value: []byte("x")})
	if err != nil {
		return fmt.Errorf("%s: put after reopen: %v", name, err)
	}
	if r.Header.Revision != head+1 {
		return fmt.Errorf("%s: first write after reopen got revision %d, head was %d", name, r.Header.Revision, head)
	}
	t.Logf("%s: %d acknowledged (max rev %d), head %d after crash, compacted %d/%d; %d checked in the log",
		name, len(img.acked), maxAck, head, c.Requested, c.Finished, checked)
	return nil
}

// checkStoreConsistent checks the on-disk invariants of the layout and
// returns the head revision and the compaction state.
func checkStoreConsistent(db storage.DB) (int64, compaction, error) {
	var head int64
	var c compaction
	err := db.View(context.Background(), func(tx storage.ReadTx) error {
		h, cc, err := readState(tx)
		if err != nil {
			return err
		}
		head, c = h.Rev, cc
		// A staged write may be pending: the revision it reserved holds
		// tombstones and log parts (never part 0) that readers ignore.
		var staging int64
		if pv, err := tx.Get(keyspace.Pending); err != nil {
			return err
		} else if pv != nil {
			if staging = int64(binary.BigEndian.Uint64(pv)) + 1; staging != head+1 {
				return fmt.Errorf("pending staged write reserved revision %d, head is %d", staging, head)
			}
		}
		// The revision log: dense from the physically compacted point to the
		// head, nothing above it but a pending write's parts.
		all, err := tx.GetRange(keyspace.LogFrom(0), keyspace.LogFrom(1<<62), storage.RangeOptions{})
		if err != nil {
			return err
		}
		var parts []storage.KeyValue
		for _, p := range all {
			rev, part, err := keyspace.ParseLog(p.Key)
			if err != nil {
				return err
			}
			switch {
			case rev != staging || staging == 0:
				parts = append(parts, p)
			case part == 0:
				return fmt.Errorf("pending revision %d has its first log part", rev)
			}
		}
		logged := map[int64][]logEvent{}
		var first, last int64 = -1, 0
		var cur [][]byte
		var curRev int64
		flush := func() error {
			if cur == nil {
				return nil
			}
			e, err := decodeLog(cur)
			if err != nil {
				return fmt.Errorf("log %d: %w", curRev, err)
			}
			logged[curRev] = e.Events
			cur = nil
			return nil
		}
		for _, p := range parts {
			rev, part, err := keyspace.ParseLog(p.Key)
			if err != nil {
				return err
			}
			if part == 0 {
				if err := flush(); err != nil {
					return err
				}
				if first < 0 {
					first = rev
				} else if rev != last+1 {
					return fmt.Errorf("revision log jumps from %d to %d", last, rev)
				}
				last, curRev = rev, rev
			} else if rev != curRev || part != len(cur) {
				return fmt.Errorf("log part %d of %d out of order", part, rev)
			}
			cur = append(cur, p.Value)
		}
		if err := flush(); err != nil {
			return err
		}
		if last != head && !(len(logged) == 0 && head == 1) {
			return fmt.Errorf("revision log ends at %d, head is %d", last, head)
		}
		if first > max(c.Finished, 2) {
			return fmt.Errorf("revision log starts at %d, physical compaction finished at %d", first, c.Finished)
		}
		// Every logged event has its history record (and all its chunks).
		for rev, evs := range logged {
			for _, ev := range evs {
				v, err := tx.Get(keyspace.History(ev.Key, rev))
				if err != nil {
					return err
				}
				if v == nil {
					if rev < c.Requested {
						continue // compacted away: allowed below the compaction
					}
					return fmt.Errorf("revision %d: %q has no history record", rev, ev.Key)
				}
				ver, err := decodeVersion(v)
				if err != nil {
					return err
				}
				if ver.Tombstone != (ev.Type == evDelete) {
					return fmt.Errorf("revision %d: %q history tombstone %v, log type %d", rev, ev.Key, ver.Tombstone, ev.Type)
				}
				b, e := keyspace.ChunkVersion(ev.Key, rev)
				chunks, err := tx.GetRange(b, e, storage.RangeOptions{})
				if err != nil {
					return err
				}
				if len(chunks) != ver.Chunks-1 {
					return fmt.Errorf("revision %d: %q has %d of %d chunks", rev, ev.Key, len(chunks)+1, ver.Chunks)
				}
			}
		}
		// The latest index agrees with the newest history record of its key,
		// and nothing in history is newer than the head.
		lb, le := keyspace.LatestRange(nil, nil)
		latest, err := tx.GetRange(lb, le, storage.RangeOptions{})
		if err != nil {
			return err
		}
		for _, kv := range latest {
			key := keyspace.LatestKey(kv.Key)
			m, err := decodeMeta(kv.Value)
			if err != nil {
				return err
			}
			vs, err := tx.GetRange(keyspace.HistoryPrefix(key), storage.Strinc(keyspace.HistoryPrefix(key)), storage.RangeOptions{Limit: 1, Reverse: true})
			if err != nil {
				return err
			}
			if len(vs) == 0 {
				return fmt.Errorf("latest %q (rev %d) without history", key, m.ModRev)
			}
			_, rev, err := keyspace.ParseHistory(vs[0].Key)
			if err != nil {
				return err
			}
			ver, err := decodeVersion(vs[0].Value)
			if err != nil {
				return err
			}
			if rev != m.ModRev || ver.Tombstone != m.Tombstone || m.ModRev > head && !(m.ModRev == staging && m.Tombstone) {
				return fmt.Errorf("latest %q says rev %d tombstone %v; newest history rev %d tombstone %v; head %d",
					key, m.ModRev, m.Tombstone, rev, ver.Tombstone, head)
			}
		}
		hb, he := keyspace.HistoryAll()
		history, err := tx.GetRange(hb, he, storage.RangeOptions{})
		if err != nil {
			return err
		}
		for _, kv := range history {
			key, rev, err := keyspace.ParseHistory(kv.Key)
			if err != nil {
				return err
			}
			if rev > head && rev != staging {
				return fmt.Errorf("history %q at %d above head %d", key, rev, head)
			}
			if v, err := tx.Get(keyspace.Latest(key)); err != nil || v == nil {
				return errors.Join(err, fmt.Errorf("history %q at %d without a latest entry", key, rev))
			}
		}
		return nil
	})
	return head, c, err
}
