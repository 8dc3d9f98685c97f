package mvcc

import (
	"bytes"
	"context"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// TestRevokesChangeLeaseRemovedKey: every revoke that removes a lease
// record changes mvcc.LeaseRemovedKey, whether it deletes no key, a few in
// one batch, or enough to be staged over several transactions; one that
// finds no record leaves it. The lessor's keep-alives trust the records
// they read before only while it is unchanged.
func TestRevokesChangeLeaseRemovedKey(t *testing.T) {
	db := testdb.Open(t)
	s := openInternal(t, db, Config{StageBytes: 8 << 10, SoleWriter: true})
	ctx := context.Background()
	mark := func() []byte {
		t.Helper()
		var v []byte
		if err := db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			v, err = tx.Get(LeaseRemovedKey)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name string
		keys int // on the lease, in fill's every third key
	}{{"keyless", 0}, {"batched", 30}, {"staged", 3000}} {
		id := int64(len(c.name))
		grantLease(t, db, id)
		if c.keys > 0 {
			fill(t, s, c.name+"/", c.keys, id)
		}
		before := mark()
		r, err := s.Revoke(ctx, &RevokeRequest{ID: id})
		if err != nil {
			t.Fatalf("%s revoke: %v", c.name, err)
		}
		if staged := c.keys > 1000 && isStaged(t, db, r.Header.Revision); staged != (c.keys > 1000) {
			t.Fatalf("%s revoke: staged %v", c.name, staged)
		}
		after := mark()
		if after == nil || bytes.Equal(before, after) {
			t.Errorf("%s revoke left the key at %x (was %x)", c.name, after, before)
		}
		if _, err := s.Revoke(ctx, &RevokeRequest{ID: id}); err == nil {
			t.Fatalf("%s: second revoke succeeded", c.name)
		}
		if again := mark(); !bytes.Equal(again, after) {
			t.Errorf("%s: a revoke of a lease without a record changed the key: %x, was %x", c.name, again, after)
		}
	}
}
