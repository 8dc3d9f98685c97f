package mvcc

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// namedDB names the snapshot of its Views with a number each Update that
// writes bumps once it returns (sound for a test with no View during a
// write), and counts the Views' reads of the head. Its transactions hide
// the backend's own snapshot names, so what is shared is decided by this
// test alone. An Update that writes nothing (the compactor's look when the
// store opens, say, which may come at any moment of the test) leaves the
// snapshot as it was.
type namedDB struct {
	storage.DB
	snap      atomic.Int64
	headReads atomic.Int64
}

func (d *namedDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	var wrote bool
	defer func() {
		if wrote {
			d.snap.Add(1)
		}
	}()
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		wrote = false // this attempt's writes are the ones committed
		return fn(&writeTx{Tx: tx, wrote: &wrote})
	})
}

// writeTx notes that its transaction writes.
type writeTx struct {
	storage.Tx
	wrote *bool
}

func (t *writeTx) Set(key, value []byte) { *t.wrote = true; t.Tx.Set(key, value) }
func (t *writeTx) Clear(key []byte)      { *t.wrote = true; t.Tx.Clear(key) }
func (t *writeTx) ClearRange(begin, end []byte) {
	*t.wrote = true
	t.Tx.ClearRange(begin, end)
}

func (d *namedDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	snap := d.snap.Load() + 1
	return d.DB.View(ctx, func(tx storage.ReadTx) error {
		return fn(&namedTx{ReadTx: tx, snap: snap, heads: &d.headReads})
	})
}

// namedTx is a View's transaction in a namedDB. block, when set, holds its
// ReadBatch until it is closed; fail then fails it.
type namedTx struct {
	storage.ReadTx
	snap    int64
	heads   *atomic.Int64
	blocked chan struct{} // closed when ReadBatch starts waiting for block
	block   chan struct{}
	fail    error
}

func (t *namedTx) Snapshot() int64 { return t.snap }

func (t *namedTx) count(keys [][]byte, ranges []storage.RangeRead) {
	for _, k := range keys {
		if bytes.Equal(k, keyspace.Head) {
			t.heads.Add(1)
		}
	}
	for _, r := range ranges {
		if bytes.Compare(r.Begin, keyspace.Head) <= 0 && bytes.Compare(keyspace.Head, r.End) < 0 {
			t.heads.Add(1)
		}
	}
}

func (t *namedTx) Get(key []byte) ([]byte, error) {
	t.count([][]byte{key}, nil)
	return t.ReadTx.Get(key)
}

func (t *namedTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	t.count(nil, []storage.RangeRead{{Begin: begin, End: end}})
	return t.ReadTx.GetRange(begin, end, opt)
}

func (t *namedTx) ReadBatch(keys [][]byte, ranges []storage.RangeRead) ([][]byte, [][]storage.KeyValue, error) {
	t.count(keys, ranges)
	if t.block != nil {
		close(t.blocked)
		<-t.block
		if t.fail != nil {
			return nil, nil, t.fail
		}
	}
	return storage.ReadBatch(t.ReadTx, keys, ranges)
}

// TestViewsOfOneSnapshotReadItsStateOnce: GETs at the head, the head read
// of Rev, GETs at a past revision and a LIST page all read one snapshot's
// state once between them, and a write's new snapshot is read again.
func TestViewsOfOneSnapshotReadItsStateOnce(t *testing.T) {
	db := &namedDB{DB: testdb.Open(t)}
	s, err := Open(db, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	put := func(k, v string) int64 {
		resp, err := s.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	get := func(r *pb.RangeRequest) *pb.RangeResponse {
		resp, err := s.Range(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, k := range []string{"a", "b", "c"} {
		put(k, "1")
	}
	rev := put("d", "1")
	db.headReads.Store(0)
	for _, k := range []string{"a", "b", "c", "d", "a"} {
		if resp := get(&pb.RangeRequest{Key: []byte(k)}); resp.Header.Revision != rev || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
			t.Fatalf("GET %s: %v", k, resp)
		}
	}
	if r, _, err := s.Rev(ctx); err != nil || r != rev {
		t.Fatalf("Rev: %d, %v; want %d", r, err, rev)
	}
	if resp := get(&pb.RangeRequest{Key: []byte("a"), Revision: rev - 1}); resp.Header.Revision != rev || len(resp.Kvs) != 1 {
		t.Fatalf("GET a at %d: %v", rev-1, resp)
	}
	if resp := get(&pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z")}); resp.Header.Revision != rev || resp.Count != 4 {
		t.Fatalf("LIST: %v", resp)
	}
	if n := db.headReads.Load(); n != 1 {
		t.Errorf("8 reads of one snapshot read its head %d times, want once", n)
	}
	rev2 := put("a", "2")
	if resp := get(&pb.RangeRequest{Key: []byte("a")}); resp.Header.Revision != rev2 || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("GET a after a write: %v, want revision %d and value 2", resp, rev2)
	}
	if n := db.headReads.Load(); n != 2 {
		t.Errorf("after a write, the new snapshot's head was read %d times in all, want twice", n)
	}
}

// heldLead is a store with key k written and a View that leads the
// reading of snapshot 1's state (share) and holds its read until release
// is closed.
type heldLead struct {
	db      storage.DB
	rev     int64 // k's write
	share   stateShare
	heads   atomic.Int64
	want    firstReads
	release chan struct{}
	done    chan error // the leading View's result
}

// holdLead starts the leading View, whose read fails with fail once
// released (nil: it succeeds), and returns once it waits in its read.
func holdLead(t *testing.T, fail error) *heldLead {
	db := testdb.Open(t)
	s, err := Open(db, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	resp, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	h := &heldLead{db: db, rev: resp.Header.Revision, want: firstReads{key: []byte("k"), atHead: true},
		release: make(chan struct{}), done: make(chan error, 1)}
	blocked := make(chan struct{})
	go func() {
		h.done <- db.View(ctx, func(tx storage.ReadTx) error {
			_, err := readFirst(ctx, &namedTx{ReadTx: tx, snap: 1, heads: &h.heads, blocked: blocked, block: h.release, fail: fail}, h.want, &h.share)
			return err
		})
	}()
	<-blocked
	return h
}

// follow reads snapshot 1's state in a View of its own with ctx, which
// follows the held lead; reading, when not nil, is closed once it sends
// its own reads.
func (h *heldLead) follow(ctx context.Context, reading chan struct{}) (firstRead, error) {
	var through chan struct{}
	if reading != nil {
		through = make(chan struct{})
		close(through)
	}
	var f firstRead
	err := h.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		f, err = readFirst(ctx, &namedTx{ReadTx: tx, snap: 1, heads: &h.heads, blocked: reading, block: through}, h.want, &h.share)
		return err
	})
	return f, err
}

// TestStateFollowersReadTheirOwnWhenTheLeaderFails: a View waiting for the
// state that another View of its snapshot reads gets a correct state of
// its own when that read fails.
func TestStateFollowersReadTheirOwnWhenTheLeaderFails(t *testing.T) {
	failure := errors.New("the leader's read failed")
	h := holdLead(t, failure)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		f, err := h.follow(context.Background(), nil)
		if err != nil || f.head.Rev != h.rev || f.key.newest == nil {
			t.Errorf("the follower read head %d, key %v, error %v; want head %d and the key", f.head.Rev, f.key.newest, err, h.rev)
		}
	}()
	close(h.release)
	if err := <-h.done; !errors.Is(err, failure) {
		t.Errorf("the leader's View: %v, want its read's failure", err)
	}
	<-followed
	if n := h.heads.Load(); n != 2 {
		t.Errorf("the head was read %d times, want twice (the failed lead, the follower's own)", n)
	}
}

// TestStateFollowersStopWithTheirRequests: a View waiting for the state
// that another View of its snapshot reads stops when its own request ends,
// however long the other's read takes.
func TestStateFollowersStopWithTheirRequests(t *testing.T) {
	h := holdLead(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed, reading := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := h.follow(ctx, reading)
		followed <- err
	}()
	<-reading // the follower has joined and sends its own reads
	cancel()
	select {
	case err := <-followed:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the follower whose request ended: %v, want %v", err, context.Canceled)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the follower whose request ended still waits for the leader after 30 s")
	}
	close(h.release)
	if err := <-h.done; err != nil {
		t.Errorf("the leader: %v", err)
	}
}
