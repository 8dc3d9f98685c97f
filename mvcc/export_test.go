//go:build fdbetcd_testhooks

package mvcc_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/mvcc/mvcctest"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// TestExportPersistedMatchesRevisionLog drives random requests, lease
// grants, revokes and compactions through a journaled store under storage
// faults, and checks that the export holds exactly what the revision log
// held before compaction removed it: every revision once, in order, with its
// values, plus the grants, revokes and compactions.
func TestExportPersistedMatchesRevisionLog(t *testing.T) {
	ctx := context.Background()
	fdb := faulty.Wrap(mvcc.Journal(openPebble(t)), faulty.Options{Seed: 3, RetryProbability: 0.2, CommitUnknownProbability: 0.2})
	s := openStore(t, fdb, mvcc.Config{CompactionBatch: 7, SoleWriter: true})
	grant := func(id int64) {
		if err := fdb.Update(ctx, func(tx storage.Tx) error {
			tx.Set(keyspace.Lease(id), []byte("test"))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i, o := range randomOps(11, 400) {
		if _, ok := o.req.(*pb.CompactionRequest); ok {
			continue // compactions below, once the log has been read
		}
		apply(ctx, s, o)
		if i%50 == 10 {
			id := int64(100 + i)
			grant(id)
			want = append(want, fmt.Sprintf("grant %d", id))
			if _, err := s.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("leased/%d", i)), Value: []byte("v"), Lease: id}); err != nil {
				t.Fatal(err)
			}
			if i%100 == 10 {
				if _, err := s.Revoke(ctx, &mvcc.RevokeRequest{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	grant(7)
	if _, err := s.Revoke(ctx, &mvcc.RevokeRequest{ID: 7}); err != nil { // no keys: no revision
		t.Fatal(err)
	}
	head, _, err := s.Rev(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var logged []mvcc.RevisionEvents
	for from := int64(2); from <= head; {
		evs, _, err := mvcctest.ReadEvents(ctx, s, from, 100)
		if err != nil {
			t.Fatal(err)
		}
		logged = append(logged, evs...)
		from = evs[len(evs)-1].Rev + 1
	}
	for _, c := range []int64{head / 3, head / 2, head} {
		if _, err := s.Compact(ctx, &pb.CompactionRequest{Revision: c, Physical: true}); err != nil {
			t.Fatal(err)
		}
	}
	exported, err := mvcc.ExportPersisted(ctx, fdb)
	if err != nil {
		t.Fatal(err)
	}
	var revs []mvcc.PersistedRequest
	var compacts []int64
	var grants, revokes, keyRevokes int
	for _, r := range exported {
		switch r.Type {
		case "txn":
			revs = append(revs, r)
		case "leaseRevoke":
			revokes++
			if r.Revision != 0 {
				keyRevokes++
				revs = append(revs, r)
			}
		case "leaseGrant":
			grants++
		case "compact":
			compacts = append(compacts, r.Compact)
		}
	}
	if len(revs) != len(logged) {
		t.Fatalf("exported %d revisions, the log had %d", len(revs), len(logged))
	}
	for i, re := range logged {
		r := revs[i]
		if r.Revision != re.Rev || len(r.Ops) != len(re.Events) {
			t.Fatalf("revision %d: exported %+v, logged %v", re.Rev, r, re.Events)
		}
		for j, ev := range re.Events {
			op := r.Ops[j]
			if op.Delete != (ev.Type == mvccpb.DELETE) || !bytes.Equal(op.Key, ev.Kv.Key) ||
				!op.Delete && (!bytes.Equal(op.Value, ev.Kv.Value) || op.Lease != ev.Kv.Lease) {
				t.Fatalf("revision %d event %d: exported %+v, logged %v", re.Rev, j, op, ev)
			}
		}
	}
	if grants != 9 || revokes != 5 || keyRevokes != 4 {
		t.Fatalf("grants %d revokes %d (with keys %d), want 9, 5, 4", grants, revokes, keyRevokes)
	}
	if fmt.Sprint(compacts) != fmt.Sprint([]int64{head / 3, head / 2, head}) {
		t.Fatalf("compactions %v", compacts)
	}
	if fdb.Stats.Unknowns.Load() == 0 {
		t.Fatal("no commit-unknown results injected")
	}
	t.Logf("%d requests exported, head %d, %d unknown results", len(exported), head, fdb.Stats.Unknowns.Load())
}

// TestExportEmpty: an empty journal exports nothing.
func TestExportEmpty(t *testing.T) {
	got, err := mvcc.ExportPersisted(context.Background(), mvcc.Journal(openPebble(t)))
	if err != nil || len(got) != 0 {
		t.Fatalf("%v %v", got, err)
	}
}
