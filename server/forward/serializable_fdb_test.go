//go:build fdb

package forward_test

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestSerializableReadSeesForwardedWrite: replicas in processes of their
// own (a FoundationDB handle each) on one keyspace. A serializable Get on
// the replica that answered a forwarded Put sees that Put, as on an etcd
// member, although it may read a snapshot a few milliseconds old that its
// own process has seen (just before, by the previous serializable Get)
// and the owner's commit is newer than.
func TestSerializableReadSeesForwardedWrite(t *testing.T) {
	prefix := fdbtest.NewPrefix(t)
	start(t, fdbtest.OpenPrefix(t, prefix), "a")
	b := start(t, fdbtest.OpenPrefix(t, prefix), "b")
	warm(t, b)
	c := ctx(t)
	for i := range 300 {
		if _, err := b.Client.Get(c, "k", clientv3.WithSerializable()); err != nil {
			t.Fatal(err)
		}
		put, err := b.Client.Put(c, "k", "v")
		if err != nil {
			t.Fatal(err)
		}
		get, err := b.Client.Get(c, "k", clientv3.WithSerializable())
		if err != nil {
			t.Fatal(err)
		}
		if get.Header.Revision < put.Header.Revision || len(get.Kvs) != 1 || get.Kvs[0].ModRevision != put.Header.Revision {
			t.Fatalf("round %d: serializable get after a put at revision %d through the same replica: header %d, kvs %v",
				i, put.Header.Revision, get.Header.Revision, get.Kvs)
		}
	}
}
