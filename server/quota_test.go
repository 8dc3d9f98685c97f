package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/quota"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

const tinyQuota = 1 << 20

func quotaReplica(t *testing.T, db storage.DB, name string, bytes int64) *testserver.Server {
	t.Helper()
	return testserver.Start(t, testserver.Options{
		DB: sharedDB{DB: db, cut: &atomic.Bool{}},
		// Every write reads the size, so that the test need not wait out
		// the refresh interval.
		Config: server.Config{Name: name, Quota: quota.Config{Bytes: bytes, Refresh: time.Nanosecond}},
	})
}

func isErr(err, want error) bool { return err != nil && err.Error() == rpctypes.ErrorDesc(want) }

// fillUntilNoSpace writes 100 kB values until the quota refuses one.
func fillUntilNoSpace(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := strings.Repeat("v", 100_000)
	for i := range 4 * tinyQuota / len(v) {
		_, err := cli.Put(ctx, fmt.Sprintf("fill/%03d", i), v)
		if isErr(err, rpctypes.ErrGRPCNoSpace) {
			return
		}
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	t.Fatalf("no NOSPACE after writing 4x the quota")
}

func healthOf(t *testing.T, base, query string) (int, string) {
	t.Helper()
	return httpGet(t, &http.Client{Timeout: 30 * time.Second}, base+"/health"+query)
}

// TestQuotaNoSpaceAlarm: past --quota-backend-bytes, writes that add data
// are refused with etcd's error and raise a NOSPACE alarm that every
// replica of the store sees and that survives restarts; deletes,
// compaction and defragmentation still work, and once space is freed and
// the alarm disarmed, writes succeed again, as with etcd.
func TestQuotaNoSpaceAlarm(t *testing.T) {
	db := testdb.Open(t)
	a := quotaReplica(t, db, "a", tinyQuota)
	b := quotaReplica(t, db, "b", 0) // etcd's default quota: b is far from it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fillUntilNoSpace(t, a.Client)
	aID := a.Header().MemberID

	al, err := b.Client.AlarmList(ctx)
	if err != nil || len(al.Alarms) != 1 || al.Alarms[0].MemberID != aID || al.Alarms[0].Alarm != pb.AlarmType_NOSPACE {
		t.Fatalf("AlarmList on the other replica: %v, %v; want NOSPACE of %x", al, err, aID)
	}
	st, err := a.Client.Status(ctx, a.Addr)
	if err != nil || st.DbSizeQuota != tinyQuota || len(st.Errors) != 1 || !strings.Contains(st.Errors[0], "alarm:NOSPACE") {
		t.Fatalf("Status: %v, %v", st, err)
	}
	if st, err := b.Client.Status(ctx, b.Addr); err != nil || st.DbSizeQuota != quota.DefaultBytes {
		t.Fatalf("Status of the default quota: %v, %v", st, err)
	}
	if code, body := healthOf(t, a.Addr, ""); code != 503 || strings.TrimSpace(body) != `{"health":"false","reason":"ALARM NOSPACE"}` {
		t.Errorf("/health under NOSPACE: %d %s", code, body)
	}
	if code, _ := healthOf(t, a.Addr, "?exclude=NOSPACE"); code != 200 {
		t.Errorf("/health?exclude=NOSPACE: %d", code)
	}
	checkNoSpaceRefusals(ctx, t, a.Client)
	checkNoSpaceRefusals(ctx, t, b.Client) // the alarm is the store's, not a's
	text := scrape(t, a.Addr)
	if v, ok := metricValue(text, "etcd_server_quota_backend_bytes"); !ok || v != "1.048576e+06" {
		t.Errorf("etcd_server_quota_backend_bytes = %q, %t", v, ok)
	}
	if v, ok := metricValue(text, "etcd_debugging_server_alarms", `alarm_type="NOSPACE"`, fmt.Sprintf(`server_id="%x"`, aID)); !ok || v != "1" {
		t.Errorf("etcd_debugging_server_alarms of the NOSPACE alarm = %q, %t", v, ok)
	}

	// The alarm survives a restart of the replica that raised it.
	a.Stop()
	a = quotaReplica(t, db, "a", tinyQuota)
	if _, err := a.Client.Put(ctx, "k", "v"); !isErr(err, rpctypes.ErrGRPCNoSpace) {
		t.Fatalf("put after restart under NOSPACE: %v", err)
	}
	recoverFromNoSpace(ctx, t, a.Client)
	if code, _ := healthOf(t, a.Addr, ""); code != 200 {
		t.Errorf("/health after disarm: %d", code)
	}
	waitFor(t, 30*time.Second, "the other replica still refuses writes after the disarm", func() bool {
		_, err := b.Client.Put(ctx, "after", "v")
		return err == nil
	})
}

// checkNoSpaceRefusals: under NOSPACE etcd refuses Put, a Txn with a put
// (even in a branch not taken) and LeaseGrant; it allows reads, deletes,
// Txns without puts, compaction and lease revocation.
func checkNoSpaceRefusals(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	refused := map[string]func() error{
		"put": func() error { _, err := cli.Put(ctx, "small", "v"); return err },
		"txn with a put in the else branch": func() error {
			_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("x"), "=", 0)).
				Then(clientv3.OpGet("x")).Else(clientv3.OpPut("x", "v")).Commit()
			return err
		},
		"lease grant": func() error { _, err := cli.Grant(ctx, 60); return err },
	}
	for name, f := range refused {
		if err := f(); !isErr(err, rpctypes.ErrGRPCNoSpace) {
			t.Errorf("%s under NOSPACE: %v, want %v", name, err, rpctypes.ErrGRPCNoSpace)
		}
	}
	if _, err := cli.Get(ctx, "fill/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Errorf("range under NOSPACE: %v", err)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpDelete("fill/000")).Commit(); err != nil {
		t.Errorf("txn with only a delete under NOSPACE: %v", err)
	}
}

// recoverFromNoSpace is etcd's documented recovery: delete, compact,
// defragment, disarm.
func recoverFromNoSpace(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	resp, err := cli.Delete(ctx, "fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("delete under NOSPACE: %v", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact under NOSPACE: %v", err)
	}
	ep := cli.Endpoints()[0]
	if _, err := cli.Defragment(ctx, ep); err != nil {
		t.Fatalf("defragment under NOSPACE: %v", err)
	}
	al, err := cli.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range al.Alarms {
		d, err := cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a))
		if err != nil || len(d.Alarms) != 1 || d.Alarms[0].MemberID != a.MemberID {
			t.Fatalf("disarm %v: %v, %v", a, d, err)
		}
	}
	if _, err := cli.Put(ctx, "after", "v"); err != nil {
		t.Fatalf("put after the recovery: %v", err)
	}
	if al, err := cli.AlarmList(ctx); err != nil || len(al.Alarms) != 0 {
		t.Fatalf("alarms after the recovery: %v, %v", al, err)
	}
}

// TestCorruptAlarmRefusesWrites: etcd refuses every write while a CORRUPT
// alarm is raised (reads still work), until it is disarmed.
func TestCorruptAlarmRefusesWrites(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	cli := ts.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	mc := pb.NewMaintenanceClient(cli.ActiveConnection())
	arm := &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 7, Alarm: pb.AlarmType_CORRUPT}
	if r, err := mc.Alarm(ctx, arm); err != nil || len(r.Alarms) != 1 || r.Alarms[0].MemberID != 7 {
		t.Fatalf("activate CORRUPT: %v, %v", r, err)
	}
	for name, f := range map[string]func() error{
		"put":          func() error { _, err := cli.Put(ctx, "k", "v"); return err },
		"delete":       func() error { _, err := cli.Delete(ctx, "k"); return err },
		"txn":          func() error { _, err := cli.Txn(ctx).Then(clientv3.OpDelete("k")).Commit(); return err },
		"compact":      func() error { _, err := cli.Compact(ctx, 1); return err },
		"lease grant":  func() error { _, err := cli.Grant(ctx, 60); return err },
		"lease revoke": func() error { _, err := cli.Revoke(ctx, lease.ID); return err },
	} {
		if err := f(); !isErr(err, rpctypes.ErrGRPCCorrupt) {
			t.Errorf("%s under CORRUPT: %v", name, err)
		}
	}
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Errorf("range under CORRUPT: %v", err)
	}
	if code, body := healthOf(t, ts.Addr, ""); code != 503 || !strings.Contains(body, "ALARM CORRUPT") {
		t.Errorf("/health under CORRUPT: %d %s", code, body)
	}
	if code, body := httpGet(t, &http.Client{Timeout: 30 * time.Second}, ts.Addr+"/readyz"); code != 503 || !strings.Contains(body, "data_corruption") {
		t.Errorf("/readyz under CORRUPT: %d %s", code, body)
	}
	arm.Action = pb.AlarmRequest_DEACTIVATE
	if r, err := mc.Alarm(ctx, arm); err != nil || len(r.Alarms) != 1 {
		t.Fatalf("deactivate CORRUPT: %v, %v", r, err)
	}
	if r, err := mc.Alarm(ctx, arm); err != nil || len(r.Alarms) != 0 {
		t.Fatalf("deactivate CORRUPT again: %v, %v; want no alarm cleared", r, err)
	}
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put after disarm: %v", err)
	}
	if code, _ := httpGet(t, &http.Client{Timeout: 30 * time.Second}, ts.Addr+"/readyz"); code != 200 {
		t.Errorf("/readyz after disarm: %d", code)
	}
}
