package revision_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// readCounter counts the point reads that reach the storage inside
// Updates: with FoundationDB each is a call into the client and a wait for
// its network thread, cached or not. (Range reads are the invariant checks
// of race builds.)
type readCounter struct {
	storage.DB
	attempts, reads atomic.Int64
}

func (d *readCounter) Update(ctx context.Context, fn func(storage.Tx) error) error {
	return d.DB.Update(ctx, func(tx storage.Tx) error {
		d.attempts.Add(1)
		return fn(&countedTx{Tx: tx, reads: &d.reads})
	})
}

type countedTx struct {
	storage.Tx
	reads *atomic.Int64
}

func (t *countedTx) Get(k []byte) ([]byte, error) {
	t.reads.Add(1)
	return t.Tx.Get(k)
}

func (t *countedTx) GetMany(ks [][]byte) ([][]byte, error) {
	t.reads.Add(1)
	return t.Tx.GetMany(ks)
}

// counterKey is a request that reads a key it names ahead (Prefetcher),
// then increments it.
type counterKey string

func (k counterKey) Prefetch(keys [][]byte) [][]byte { return append(keys, []byte(k)) }

func (k counterKey) Apply(tx storage.Tx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	v, err := tx.Get([]byte(k))
	if err != nil {
		return 0, false, nil, err
	}
	var n int64
	if v != nil {
		if _, err := fmt.Sscan(string(v), &n); err != nil {
			return 0, false, nil, err
		}
	}
	tx.Set([]byte(k), fmt.Appendf(nil, "%d", n+1))
	tx.Set(keyspace.Log(rev+1, 0), []byte(k))
	return n + 1, true, nil, nil
}

func (counterKey) Replay(storage.ReadTx, *revision.Env, int64, revision.RequestID) (int64, bool, error, error) {
	return 0, true, nil, nil
}

// A batch reads what it prefetched in one call to the storage; its
// requests' reads of those keys are answered from the attempt's own
// cache, and each request sees what the ones before it in the batch wrote.
func TestPrefetchedReadsStayInProcess(t *testing.T) {
	db := &readCounter{DB: openDB(t)}
	seq := revision.New[int64](db, recorder{}, revision.Config{})
	defer seq.Stop()
	const callers, each = 16, 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int64]bool{}
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				n, err := seq.Do(context.Background(), counterKey("counter"), 10)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[n] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for n := int64(1); n <= callers*each; n++ {
		if !got[n] {
			t.Fatalf("no request counted to %d: a request of a batch missed an earlier one's write", n)
		}
	}
	if a, r := db.attempts.Load(), db.reads.Load(); r != a {
		t.Fatalf("%d attempts made %d point reads of the storage, want one each", a, r)
	}
}

// clearing is a request that checks that its reads of a prefetched key
// follow its own Set, Clear and ClearRange of it.
type clearing struct{ t *testing.T }

func (clearing) Prefetch(keys [][]byte) [][]byte { return append(keys, []byte("c/a"), []byte("c/b")) }

func (c clearing) Apply(tx storage.Tx, _ *revision.Env, rev int64, _ revision.RequestID) (int64, bool, error, error) {
	read := func(k string, want []byte) {
		v, err := tx.Get([]byte(k))
		if err != nil || !bytes.Equal(v, want) {
			c.t.Errorf("after its own writes %s reads %q, %v; want %q", k, v, err, want)
		}
		vs, err := tx.GetMany([][]byte{[]byte(k), []byte("c/other")})
		if err != nil || !bytes.Equal(vs[0], want) {
			c.t.Errorf("after its own writes GetMany %s reads %q, %v; want %q", k, vs, err, want)
		}
	}
	buf := []byte("one")
	tx.Set([]byte("c/a"), buf)
	copy(buf, "xxx") // Set copied it
	read("c/a", []byte("one"))
	tx.Clear([]byte("c/a"))
	read("c/a", nil)
	tx.Set([]byte("c/b"), []byte("two"))
	tx.ClearRange([]byte("c/"), []byte("c0"))
	read("c/b", nil)
	tx.Set([]byte("c/b"), []byte("three"))
	read("c/b", []byte("three"))
	tx.Set(keyspace.Log(rev+1, 0), []byte("c"))
	return rev + 1, true, nil, nil
}

func (clearing) Replay(storage.ReadTx, *revision.Env, int64, revision.RequestID) (int64, bool, error, error) {
	return 0, true, nil, nil
}

func TestPrefetchedReadsFollowOwnWrites(t *testing.T) {
	seq := revision.New[int64](openDB(t), recorder{}, revision.Config{})
	defer seq.Stop()
	if _, err := seq.Do(context.Background(), counterKey("c/a"), 10); err != nil {
		t.Fatal(err)
	}
	if _, err := seq.Do(context.Background(), clearing{t}, 10); err != nil {
		t.Fatal(err)
	}
}
