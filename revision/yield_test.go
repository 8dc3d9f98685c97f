package revision_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// stored returns the value of key k, or nil.
func stored(t *testing.T, db storage.DB, k string) []byte {
	t.Helper()
	var v []byte
	err := db.View(context.Background(), func(tx storage.ReadTx) (err error) {
		v, err = tx.Get([]byte(k))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestYieldGivesUpARetriedBatch: a batch whose attempt failed is given up
// when Yield says so: its request is answered ErrYielded and nothing of it
// is applied, and the next request takes the revision it would have taken.
// Yield is asked only before a retry, never before a first attempt.
func TestYieldGivesUpARetriedBatch(t *testing.T) {
	db := faulty.Wrap(openDB(t), faulty.Options{Seed: 1, RetryProbability: 1})
	asked := 0
	seq := revision.New[int64](db, recorder{}, revision.Config{Yield: func() bool {
		asked++
		db.SetOptions(faulty.Options{}) // the fence after it must commit
		return true
	}})
	defer seq.Stop()
	if _, err := seq.Do(context.Background(), key("yielded"), 10); !errors.Is(err, revision.ErrYielded) {
		t.Fatalf("a conflicting batch that yields: %v, want ErrYielded", err)
	}
	if asked != 1 {
		t.Errorf("Yield asked %d times, want once (before the one retry)", asked)
	}
	if v := stored(t, db, "yielded"); v != nil {
		t.Fatalf("the yielded request was applied at %s", v)
	}
	rev, err := seq.Do(context.Background(), key("next"), 10)
	if err != nil || rev != 2 {
		t.Fatalf("the request after it: revision %d, %v; want 2 (dense)", rev, err)
	}
	if asked != 1 {
		t.Errorf("Yield asked before a first attempt (%d times in all)", asked)
	}
}

// TestYieldNeverDropsALandedBatch: an attempt reported commit_unknown_result
// that did commit is found on the retry and answered as committed, even
// when Yield would give the batch up.
func TestYieldNeverDropsALandedBatch(t *testing.T) {
	db := faulty.Wrap(openDB(t), faulty.Options{Seed: 1, CommitUnknownProbability: 1})
	seq := revision.New[int64](db, recorder{}, revision.Config{Yield: func() bool { return true }})
	defer seq.Stop()
	rev, err := seq.Do(context.Background(), key("landed"), 10)
	if err != nil || rev != 2 {
		t.Fatalf("a landed batch: revision %d, %v; want 2", rev, err)
	}
	if v := stored(t, db, "landed"); string(v) != fmt.Sprint(2) {
		t.Fatalf("landed = %q, want applied once at 2", v)
	}
}
