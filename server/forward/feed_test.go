package forward_test

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
)

// ownerAndFollower starts two replicas on one store: a, which owns writes,
// and b, which follows a's commit feed. On Pebble the test is skipped:
// replicas on one Pebble store are sole writers (testserver), with no feed
// to follow.
func ownerAndFollower(t *testing.T) (a, b *testserver.Server) {
	t.Helper()
	if testdb.Backend() == "pebble" {
		t.Skip("replicas on one Pebble store are sole writers (testserver): no feed to follow")
	}
	db := testdb.Open(t)
	return start(t, db, "a"), start(t, db, "b")
}

// TestReplicaFollowsTheOwnersCommits: a replica follows the write owner's
// commit feed (server/commitfeed), so it learns of a write made on the
// owner from the owner itself, not only from the store's notification;
// the owner follows nobody.
func TestReplicaFollowsTheOwnersCommits(t *testing.T) {
	a, b := ownerAndFollower(t)
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

// TestReplicaHoldsTheOwnersEvents: a replica's watch hub reads the
// revisions the owner committed from memory — the events came with the
// owner's commit feed — not from storage, and its watchers get them.
func TestReplicaHoldsTheOwnersEvents(t *testing.T) {
	a, b := ownerAndFollower(t)
	c := ctx(t)
	wch := b.Client.Watch(c, "w/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	// The watch is up, and b follows a's feed, once a first put reaches b.
	if _, err := a.Client.Put(c, "w/0", "v"); err != nil {
		t.Fatal(err)
	}
	if resp := <-wch; resp.Err() != nil || len(resp.Events) != 1 {
		t.Fatalf("first event: %+v", resp)
	}
	const memory, storage = `fdb_etcd_watch_hub_reads_total{from="memory"}`, `fdb_etcd_watch_hub_reads_total{from="storage"}`
	before := string(scrapeHandler(t, b.Server))
	const puts = 20
	for i := 1; i <= puts; i++ {
		// Apart, as a quiet cluster's writes are: each is sent on the feed
		// at once (commitfeed.DefaultMinInterval).
		time.Sleep(10 * time.Millisecond)
		if _, err := a.Client.Put(c, fmt.Sprintf("w/%d", i%3), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		got := 0
		for got == 0 {
			resp := <-wch
			if resp.Err() != nil {
				t.Fatal(resp.Err())
			}
			for _, ev := range resp.Events {
				if string(ev.Kv.Value) != fmt.Sprint(i) || (i > 2 && ev.PrevKv == nil) {
					t.Fatalf("put %d: event %v", i, ev)
				}
				got++
			}
		}
	}
	after := string(scrapeHandler(t, b.Server))
	fromMemory := metricValue(after, memory) - metricValue(before, memory)
	fromStorage := metricValue(after, storage) - metricValue(before, storage)
	if fromMemory == 0 || fromStorage >= fromMemory {
		t.Fatalf("b's hub read new revisions %d times from memory and %d from storage:\n%s", fromMemory, fromStorage, grep(after, "hub_reads"))
	}
	t.Logf("b's hub read %d puts' revisions %d times from memory, %d from storage", puts, fromMemory, fromStorage)
}

// TestFollowerWatchAtTheCompaction: a watch from the revision the owner
// compacted at gets what storage holds there, the event without the
// previous version compaction removed, on a follower too, although the
// follower holds that revision's events from the owner's feed, previous
// version included, and has not heard of the compaction: a watcher
// starting in the past reads storage. (kube-apiserver's storage suite,
// Watch/WatchFromZero, expects that error of a watch there.)
func TestFollowerWatchAtTheCompaction(t *testing.T) {
	a, b := ownerAndFollower(t)
	c := ctx(t)
	wch := b.Client.Watch(c, "w/", clientv3.WithPrefix())
	var last int64
	for i := range 5 {
		put, err := a.Client.Put(c, "w/k", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		last = put.Header.Revision
	}
	for got := int64(0); got < last; {
		resp := <-wch
		if resp.Err() != nil {
			t.Fatal(resp.Err())
		}
		for _, ev := range resp.Events {
			got = ev.Kv.ModRevision
		}
	}
	if _, err := a.Client.Compact(c, last, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	resp := <-b.Client.Watch(c, "w/", clientv3.WithPrefix(), clientv3.WithRev(last), clientv3.WithPrevKV())
	if resp.Err() != nil || len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != last || resp.Events[0].PrevKv != nil {
		t.Fatalf("watch from %d, compacted at %d: %v, events %v; want the event without its compacted previous version", last, last, resp.Err(), resp.Events)
	}
}
