package mvcc

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// headScanDB counts the range reads that cover keyspace.Head. Its
// transactions scan in place, as the embedded store's do.
type headScanDB struct {
	storage.DB
	headScans atomic.Int64
}

type headScanTx struct {
	storage.ReadTx
	db *headScanDB
}

func (d *headScanDB) View(ctx context.Context, fn func(tx storage.ReadTx) error) error {
	return d.DB.View(ctx, func(tx storage.ReadTx) error { return fn(headScanTx{ReadTx: tx, db: d}) })
}

func (t headScanTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if bytes.Compare(begin, keyspace.Head) <= 0 && bytes.Compare(keyspace.Head, end) < 0 {
		t.db.headScans.Add(1)
	}
	return t.ReadTx.GetRange(begin, end, opt)
}

func (t headScanTx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	return t.ReadTx.(storage.Scanner).Scan(begin, end, fn)
}

// TestStateReadsDoNotScanTheHead: on a store that scans in place, reads
// take the head and the compaction record by key, never by a range from
// one to the other. Every commit rewrites the head, and an LSM store holds
// each version until its memtable is flushed: such a range steps over all
// of them (BenchmarkRangeAfterWrites: an empty Range took 10 µs on a
// fresh store and 858 µs after 20,000 writes).
func TestStateReadsDoNotScanTheHead(t *testing.T) {
	pdb, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pdb.Close() })
	db := &headScanDB{DB: pdb}
	s, err := Open(db, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	p, err := s.Put(ctx, &pb.PutRequest{Key: []byte("a/1"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	before := db.headScans.Load()
	for _, r := range []*pb.RangeRequest{
		{Key: []byte("a/"), RangeEnd: []byte("a0")},
		{Key: []byte("a/"), RangeEnd: []byte("a0"), Revision: p.Header.Revision},
		{Key: []byte("a/1"), Revision: p.Header.Revision},
	} {
		if _, err := s.Range(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ReadWatchEvents(ctx, WatchRead{From: 1, FromStorage: true}); err != nil {
		t.Fatal(err)
	}
	if n := db.headScans.Load() - before; n != 0 {
		t.Fatalf("%d range reads over the head", n)
	}
}
