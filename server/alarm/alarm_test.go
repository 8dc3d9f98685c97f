package alarm

import (
	"context"
	"os"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

// TestMain lets `make test-fdb` run this package's tests on FoundationDB.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, db storage.DB) *Store {
	t.Helper()
	s, err := Open(ctxT(t), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// TestAlarmsAreTheStores: an alarm one replica raises is seen by the
// others without a request reading it, and by a replica started later.
func TestAlarmsAreTheStores(t *testing.T) {
	db := testdb.Open(t)
	a, b := open(t, db), open(t, db)
	ctx := ctxT(t)
	m, err := a.Activate(ctx, 1, pb.AlarmType_NOSPACE)
	if err != nil || m.MemberID != 1 || m.Alarm != pb.AlarmType_NOSPACE {
		t.Fatalf("Activate: %v, %v", m, err)
	}
	if !a.Active(pb.AlarmType_NOSPACE) || !a.Raised(1, pb.AlarmType_NOSPACE) || a.Raised(2, pb.AlarmType_NOSPACE) {
		t.Fatal("the raising store does not see its own alarm")
	}
	deadline := time.Now().Add(20 * time.Second)
	for !b.Active(pb.AlarmType_NOSPACE) {
		if time.Now().After(deadline) {
			t.Fatal("the other store never saw the alarm")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// etcd answers an activation of a raised alarm with the alarm, and
	// keeps one entry per member and type.
	if m, err := b.Activate(ctx, 1, pb.AlarmType_NOSPACE); err != nil || m == nil {
		t.Fatalf("second Activate: %v, %v", m, err)
	}
	if _, err := b.Activate(ctx, 2, pb.AlarmType_NOSPACE); err != nil {
		t.Fatal(err)
	}
	if m, err := b.Activate(ctx, 2, pb.AlarmType_NONE); err != nil || m != nil {
		t.Fatalf("Activate NONE: %v, %v", m, err)
	}
	c := open(t, db)
	got, err := c.List(ctx, pb.AlarmType_NONE)
	if err != nil || len(got) != 2 || got[0].MemberID != 1 || got[1].MemberID != 2 {
		t.Fatalf("List on a new store: %v, %v", got, err)
	}
	if got, _ := c.List(ctx, pb.AlarmType_CORRUPT); len(got) != 0 {
		t.Fatalf("List CORRUPT: %v", got)
	}
	if m, err := c.Deactivate(ctx, 1, pb.AlarmType_NOSPACE); err != nil || m == nil || m.MemberID != 1 {
		t.Fatalf("Deactivate: %v, %v", m, err)
	}
	if m, err := c.Deactivate(ctx, 1, pb.AlarmType_NOSPACE); err != nil || m != nil {
		t.Fatalf("Deactivate of a cleared alarm: %v, %v; want nothing", m, err)
	}
}

// TestDeactivateAfterCommitUnknown: a deactivation whose commit was
// reported unknown (FoundationDB's 1021) and that runs again must still
// answer that it cleared the alarm, not that there was none.
func TestDeactivateAfterCommitUnknown(t *testing.T) {
	inner := testdb.Open(t)
	db := faulty.Wrap(inner, faulty.Options{Seed: 1, CommitUnknownProbability: 1})
	s := open(t, db)
	ctx := ctxT(t)
	if _, err := s.Activate(ctx, 9, pb.AlarmType_NOSPACE); err != nil {
		t.Fatal(err)
	}
	m, err := s.Deactivate(ctx, 9, pb.AlarmType_NOSPACE)
	if err != nil || m == nil || m.MemberID != 9 {
		t.Fatalf("Deactivate replayed after commit-unknown: %v, %v; want the cleared alarm", m, err)
	}
	if db.Stats.Unknowns.Load() == 0 {
		t.Fatal("no commit-unknown was injected")
	}
	if s.Active(pb.AlarmType_NOSPACE) {
		t.Fatal("alarm still active")
	}
}
