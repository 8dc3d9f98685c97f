//go:build fdb

package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// grvCounter counts FoundationDB read version requests.
type grvCounter struct{ n atomic.Int64 }

func (*grvCounter) ObserveFDBRetry(int, error)            {}
func (*grvCounter) ObserveFDBCommit(time.Duration, error) {}
func (c *grvCounter) ObserveFDBReadVersion(time.Duration) { c.n.Add(1) }
func (*grvCounter) ObserveFDBRecovery()                   {}

// TestGrantRevisionWithoutReadVersion: a grant reports a revision no older
// than the writes acknowledged before it, read at a snapshot no older than
// its own commit, without a read version request per grant. The DB's clock
// stands still, so every version it has seen stays reusable.
func TestGrantRevisionWithoutReadVersion(t *testing.T) {
	if testdb.Backend() != "fdb" {
		t.Skip("counts FoundationDB read versions")
	}
	clk := fakeclock.New(time.Unix(1_000_000, 0))
	db, err := fdb.Open(fdb.Options{ClusterFile: fdbtest.ClusterFile(t), Prefix: fdbtest.NewPrefix(t), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	store, err := mvcc.Open(db, mvcc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	own := owner.Start(db, owner.Config{})
	l := New(store, own, Config{})
	t.Cleanup(func() { l.Stop(); own.Stop(); store.Close() })
	ctx := context.Background()
	grvs := &grvCounter{}
	db.SetObserver(grvs)
	const grants = 20
	for i := range grants {
		put, err := store.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		g, err := l.Grant(ctx, 0, 60)
		if err != nil {
			t.Fatal(err)
		}
		if g.Revision < put.Header.Revision {
			t.Fatalf("grant after a put at revision %d reported revision %d", put.Header.Revision, g.Revision)
		}
	}
	// The owner's and the expiry's own transactions may ask for a few.
	n := grvs.n.Load()
	t.Logf("%d puts and grants asked for %d read versions", grants, n)
	if n >= grants/2 {
		t.Fatalf("%d puts and grants asked for %d read versions, want fewer than %d", grants, n, grants/2)
	}
}
