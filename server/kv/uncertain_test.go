package kv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// uncertainDB, once armed, lets the next transaction that moves the head
// commit and then fails it the way the FoundationDB backend fails an Update
// whose commit was reported unknown (1021) and whose context then ended: the
// write landed, and the server cannot know it.
type uncertainDB struct {
	storage.DB
	armed atomic.Bool
}

type headTx struct {
	storage.Tx
	movedHead bool
}

func (t *headTx) Set(k, v []byte) {
	t.movedHead = t.movedHead || bytes.Equal(k, keyspace.Head)
	t.Tx.Set(k, v)
}

func (d *uncertainDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	if !d.armed.Load() {
		return d.DB.Update(ctx, fn)
	}
	moved := false
	err := d.DB.Update(ctx, func(tx storage.Tx) error {
		ht := &headTx{Tx: tx}
		err := fn(ht)
		moved = ht.movedHead
		return err
	})
	if err != nil || !moved || !d.armed.CompareAndSwap(true, false) {
		return err
	}
	return fmt.Errorf("%w (%w: an earlier attempt may have committed)", context.DeadlineExceeded, storage.ErrCommitUnknownResult)
}

// A write whose outcome the server cannot know (it may have landed) is
// answered as etcd answers a proposal that timed out: "etcdserver: request
// timed out" (Unavailable). Answered DeadlineExceeded, it was sent again by
// clientv3, which retries that code while its caller's context lasts: a put
// that had landed was applied twice, and every watcher saw a revision no
// client had been told of.
func TestUncertainWriteIsNotSentAgain(t *testing.T) {
	db := &uncertainDB{DB: testdb.Open(t)}
	s := testserver.Start(t, testserver.Options{DB: db})
	ctx := context.Background()
	c := s.Client
	before, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	db.armed.Store(true)
	_, err = c.Put(ctx, "k", "v")
	if !errors.Is(err, rpctypes.ErrTimeout) {
		t.Errorf("put with an unknown outcome = %v, want %v", err, rpctypes.ErrTimeout)
	}
	after, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Kvs) != 1 || after.Kvs[0].Version != 1 || after.Header.Revision != before.Header.Revision+1 {
		t.Fatalf("after one put: %v at revision %d (was %d), want version 1 one revision later: the put was applied more than once",
			after.Kvs, after.Header.Revision, before.Header.Revision)
	}
}
