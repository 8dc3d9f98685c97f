package forward_test

import (
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
)

// TestReplicaFollowsTheOwnersCommits: a replica follows the write owner's
// commit feed (server/commitfeed), so it learns of a write made on the
// owner from the owner itself, not only from the store's notification;
// the owner follows nobody.
func TestReplicaFollowsTheOwnersCommits(t *testing.T) {
	if testdb.Backend() == "pebble" {
		t.Skip("replicas on one Pebble store are sole writers (testserver): no feed to follow")
	}
	db := testdb.Open(t)
	a := start(t, db, "a")
	b := start(t, db, "b")
	c := ctx(t)
	const feed = "fdb_etcd_commit_feed_revision"
	for i := 0; i < 3; i++ {
		put, err := a.Client.Put(c, "k", "v")
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for metricValue(string(scrapeHandler(t, b.Server)), feed) < int(put.Header.Revision) {
			if time.Now().After(deadline) {
				t.Fatalf("b's %s = %d, never reached a's put at %d:\n%s", feed,
					metricValue(string(scrapeHandler(t, b.Server)), feed), put.Header.Revision,
					grep(string(scrapeHandler(t, b.Server)), feed))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if got := metricValue(string(scrapeHandler(t, a.Server)), feed); got != 0 {
		t.Errorf("a, the owner, followed a feed to revision %d", got)
	}
}
