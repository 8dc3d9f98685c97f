//go:build fdbetcd_testhooks

package mvcc

import (
	"context"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// TestExportStagedWrites: the persisted-request export (the robustness
// tests' WAL) rebuilds a staged DeleteRange as one revision and a staged
// revoke as one leaseRevoke with its revision, though their log parts were
// written by several transactions before the publishing one.
func TestExportStagedWrites(t *testing.T) {
	ctx := context.Background()
	db := faulty.Wrap(Journal(testdb.Open(t)), faulty.Options{Seed: 4, CommitUnknownProbability: 0.3})
	s := openInternal(t, db, Config{StageBytes: 8 << 10, SoleWriter: true})
	grantLease(t, db, 7)
	fill(t, s, "a/", 1000, 7)
	if _, err := s.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("a/"), RangeEnd: []byte("a/0000500")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(ctx, &RevokeRequest{ID: 7}); err != nil {
		t.Fatal(err)
	}
	reqs, err := ExportPersisted(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reqs {
		got = append(got, fmt.Sprintf("%s rev %d lease %d: %d ops", r.Type, r.Revision, r.LeaseID, len(r.Ops)))
	}
	want := []string{"leaseGrant rev 0 lease 7: 0 ops", "txn rev 2 lease 0: 500 ops", "txn rev 3 lease 0: 500 ops",
		"txn rev 4 lease 0: 500 ops", "leaseRevoke rev 5 lease 7: 167 ops"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("export:\n%s\nwant\n%s", got, want)
	}
	if !isStaged(t, db, 4) || !isStaged(t, db, 5) {
		t.Fatal("the delete and the revoke were not staged")
	}
}

// FuzzDecodeJournal: the journal's decoder rejects, never panics on,
// arbitrary bytes.
func FuzzDecodeJournal(f *testing.F) {
	jt := &journalTx{}
	jt.record(jopSet, []byte("k"), []byte("v"))
	jt.record(jopClear, []byte("k"), nil)
	f.Add(jt.rec)
	f.Fuzz(func(t *testing.T, b []byte) {
		ops, err := decodeJournal(b)
		if err == nil && len(b) > 0 && len(ops) == 0 {
			t.Fatalf("%x decoded to no operations", b)
		}
	})
}
