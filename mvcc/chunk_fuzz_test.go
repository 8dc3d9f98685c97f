package mvcc

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// fuzzValue repeats pattern to n bytes (n bounded), so that small fuzz
// inputs still cross chunk boundaries.
func fuzzValue(pattern []byte, reps uint32) []byte {
	if len(pattern) == 0 {
		return nil
	}
	n := min(len(pattern)*int(reps%4096), 1<<20)
	out := make([]byte, n)
	for i := 0; i < n; i += copy(out[i:], pattern) {
	}
	return out
}

var (
	fuzzStoreOnce sync.Once
	fuzzStore     *Store
	fuzzStoreErr  error
)

// FuzzValueChunking checks the split of values into FoundationDB-sized
// chunks and the records that carry them: the chunks rebuild the value, none
// exceeds the storage value limit, version and log records round-trip, and
// decoders never panic on arbitrary bytes. Each value is also written and
// read back through a Store whose storage enforces FoundationDB's limits.
func FuzzValueChunking(f *testing.F) {
	f.Add([]byte("v"), uint32(1), int64(3), int64(0), []byte("k"))
	f.Add([]byte("0123456789abcdef"), uint32(chunkSize/16), int64(1), int64(7), []byte("k\x00"))
	f.Add([]byte("0123456789abcdef"), uint32(chunkSize/16+1), int64(1<<40), int64(-1), []byte{0xff})
	f.Add([]byte{0, 1, 2}, uint32(4095), int64(9), int64(1), []byte("a/b"))
	f.Fuzz(func(t *testing.T, pattern []byte, reps uint32, createRev, lease int64, key []byte) {
		value := fuzzValue(pattern, reps)
		first, rest := splitValue(value)
		got := append(bytes.Clone(first), bytes.Join(rest, nil)...)
		if !bytes.Equal(got, value) && !(len(got) == 0 && len(value) == 0) {
			t.Fatalf("chunks of a %d-byte value rebuild %d bytes", len(value), len(got))
		}
		if len(first) > chunkSize || len(value) > chunkSize && len(first) != chunkSize {
			t.Fatalf("first chunk %d bytes", len(first))
		}
		for i, c := range rest {
			if len(c) == 0 || len(c) > chunkSize || len(c) > storage.MaxValueSize {
				t.Fatalf("chunk %d of %d bytes", i+1, len(c))
			}
		}
		if want := max(1, (len(value)+chunkSize-1)/chunkSize); 1+len(rest) != want {
			t.Fatalf("%d-byte value in %d chunks, want %d", len(value), 1+len(rest), want)
		}
		createRev = max(createRev, 0)
		v := version{Sub: int64(len(rest)), CreateRev: createRev, Version: createRev / 2, Lease: lease,
			Chunks: 1 + len(rest), ValueLen: int64(len(value)), First: first}
		enc := encodeVersion(v)
		if len(enc) > storage.MaxValueSize {
			t.Fatalf("history record of %d bytes exceeds the value limit", len(enc))
		}
		dec, err := decodeVersion(enc)
		if err != nil || dec.Sub != v.Sub || dec.CreateRev != v.CreateRev || dec.Version != v.Version || dec.Lease != v.Lease ||
			dec.Chunks != v.Chunks || dec.ValueLen != v.ValueLen || !bytes.Equal(dec.First, v.First) {
			t.Fatalf("version round trip: %+v -> %+v %v", v, dec, err)
		}

		// The revision log splits into parts under the value limit and
		// round-trips, for events with keys up to the largest storable.
		e := logEntry{ID: revision.RequestID{Writer: uint64(lease), Seq: uint64(createRev), Index: reps}}
		for i := 0; i < int(reps%200); i++ {
			k := key
			if i%3 == 0 {
				k = fuzzValue(append(key, byte(i)), 9989/max(1, uint32(len(key)+1)))
			}
			if len(k) > 9989 {
				k = k[:9989]
			}
			e.Events = append(e.Events, logEvent{Type: byte(i % 2), Sub: int64(i), PrevRev: createRev, Key: k})
		}
		parts := encodeLog(e)
		for i, p := range parts {
			if len(p) > storage.MaxValueSize {
				t.Fatalf("log part %d of %d bytes exceeds the value limit", i, len(p))
			}
		}
		back, err := decodeLog(parts)
		if err != nil || back.ID != e.ID || len(back.Events) != len(e.Events) {
			t.Fatalf("log round trip: %v, %d events, want %d", err, len(back.Events), len(e.Events))
		}
		for i := range e.Events {
			a, b := e.Events[i], back.Events[i]
			if a.Type != b.Type || a.Sub != b.Sub || a.PrevRev != b.PrevRev || !bytes.Equal(a.Key, b.Key) {
				t.Fatalf("log event %d: %+v -> %+v", i, a, b)
			}
		}

		// Decoders must reject, never panic on, arbitrary bytes.
		_, _ = decodeVersion(pattern)
		_, _ = decodeMeta(pattern)
		_, _ = decodeLog([][]byte{pattern})
		_, _ = decodeLog([][]byte{enc, pattern})
		_, _ = decodeCompaction(pattern)
		_, _ = decodeLogPart(pattern, false)

		// End to end: the value through a store under FoundationDB's limits.
		fuzzStoreOnce.Do(func() {
			db, err := pebble.Open("fuzz", pebble.Options{FS: vfs.NewMem(), NoSync: true, CacheBytes: 8 << 20})
			if err != nil {
				fuzzStoreErr = err
				return
			}
			fuzzStore, fuzzStoreErr = Open(faulty.Wrap(db, faulty.Options{}), Config{})
		})
		if fuzzStoreErr != nil {
			t.Fatal(fuzzStoreErr)
		}
		ctx := context.Background()
		k := append([]byte("fuzz/"), key...)
		if len(k) > 9989 {
			k = k[:9989]
		}
		put, err := fuzzStore.Put(ctx, &pb.PutRequest{Key: k, Value: value})
		if err != nil {
			t.Fatalf("put of a %d-byte value: %v", len(value), err)
		}
		r, err := fuzzStore.Range(ctx, &pb.RangeRequest{Key: k})
		if err != nil || len(r.Kvs) != 1 || !bytes.Equal(r.Kvs[0].Value, value) || r.Kvs[0].ModRevision != put.Header.Revision {
			t.Fatalf("read back of a %d-byte value: %v", len(value), err)
		}
		evs, err := revisionEvents(ctx, fuzzStore, put.Header.Revision)
		if err != nil || len(evs) != 1 || len(evs[0].Events) != 1 || !bytes.Equal(evs[0].Events[0].Kv.Value, value) {
			t.Fatalf("event of a %d-byte value: %v", len(value), err)
		}
	})
}
