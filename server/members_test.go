package server_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// sharedDB lets several in-process replicas use one store, as replicas
// share one FoundationDB keyspace: a replica that stops leaves it open for
// the others. Cut makes every call fail, as for a replica cut off from the
// store.
type sharedDB struct {
	storage.DB
	cut *atomic.Bool
}

var errCut = errors.New("test: replica cut off from the store")

func (d sharedDB) Close() error { return nil }

// Size and Defragment pass through to the store.
func (d sharedDB) Size() (int64, error) { return d.DB.(storage.Sizer).Size() }

func (d sharedDB) Defragment(ctx context.Context) error {
	if df, ok := d.DB.(interface{ Defragment(context.Context) error }); ok {
		return df.Defragment(ctx)
	}
	return nil
}

func (d sharedDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	if d.cut.Load() {
		return errCut
	}
	return d.DB.Update(ctx, fn)
}

func (d sharedDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if d.cut.Load() {
		return errCut
	}
	return d.DB.View(ctx, fn)
}

// memberTTL is short so that a dead replica leaves the list quickly.
const memberTTL = 2 * time.Second

func startReplica(t *testing.T, db storage.DB, name string) (*testserver.Server, *atomic.Bool) {
	t.Helper()
	cut := &atomic.Bool{}
	ts := testserver.Start(t, testserver.Options{
		DB:     sharedDB{DB: db, cut: cut},
		Config: server.Config{Name: name, Members: cluster.RegistryConfig{TTL: memberTTL}},
	})
	return ts, cut
}

func memberURLs(t *testing.T, cli *clientv3.Client) map[uint64][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("MemberList: %v", err)
	}
	out := map[uint64][]string{}
	for _, m := range resp.Members {
		out[m.ID] = m.ClientURLs
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMemberListListsEveryReplica: replicas of one store each list all the
// live ones, so a client that syncs its endpoints from MemberList
// (AutoSyncInterval) spreads over all of them instead of collapsing onto
// the one it first reached.
func TestMemberListListsEveryReplica(t *testing.T) {
	db := testdb.Open(t)
	a, _ := startReplica(t, db, "a")
	b, _ := startReplica(t, db, "b")
	c, _ := startReplica(t, db, "c")
	want := map[uint64]string{
		a.Header().MemberID: a.Addr, b.Header().MemberID: b.Addr, c.Header().MemberID: c.Addr,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []*testserver.Server{a, b, c} {
		resp, err := r.Client.MemberList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Members) != 3 || resp.Header.MemberId != r.Header().MemberID || resp.Header.Revision != 0 {
			t.Fatalf("MemberList from %s: header %v, %d members: %v", r.Addr, resp.Header, len(resp.Members), resp.Members)
		}
		for i, m := range resp.Members {
			if want[m.ID] == "" || !slices.Equal(m.ClientURLs, []string{want[m.ID]}) || len(m.PeerURLs) != 0 || m.IsLearner || m.Name == "" {
				t.Errorf("member %v, want one of %v", m, want)
			}
			if i > 0 && resp.Members[i-1].ID >= m.ID {
				t.Errorf("members not ordered by id: %v", resp.Members)
			}
		}
	}

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:        []string{a.Addr},
		AutoSyncInterval: 100 * time.Millisecond,
		DialTimeout:      5 * time.Second,
		Logger:           zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	all := []string{a.Addr, b.Addr, c.Addr}
	slices.Sort(all)
	endpoints := func() []string { e := slices.Clone(cli.Endpoints()); slices.Sort(e); return e }
	waitFor(t, 30*time.Second, "the auto-syncing client has not learned every replica", func() bool {
		return slices.Equal(endpoints(), all)
	})

	// A replica that stops leaves the list at once.
	cID := c.Header().MemberID
	c.Stop()
	waitFor(t, 30*time.Second, "the auto-syncing client still lists the stopped replica", func() bool {
		return len(cli.Endpoints()) == 2
	})
	if _, ok := memberURLs(t, a.Client)[cID]; ok {
		t.Fatal("stopped replica still listed")
	}

	// Restarted with its name, it has its old id and is listed again.
	c2, _ := startReplica(t, db, "c")
	if c2.Header().MemberID != cID {
		t.Fatalf("restarted replica has id %x, had %x", c2.Header().MemberID, cID)
	}
	if got := memberURLs(t, a.Client)[cID]; !slices.Equal(got, []string{c2.Addr}) {
		t.Fatalf("restarted replica listed with %v, want [%s]", got, c2.Addr)
	}
}

// TestMemberListDropsDeadReplica: a replica that can no longer renew its
// record (it crashed, or lost the store) leaves the list within its TTL.
func TestMemberListDropsDeadReplica(t *testing.T) {
	db := testdb.Open(t)
	a, _ := startReplica(t, db, "a")
	b, cutB := startReplica(t, db, "b")
	bID := b.Header().MemberID
	if _, ok := memberURLs(t, a.Client)[bID]; !ok {
		t.Fatal("b not listed")
	}
	cutB.Store(true)
	cut := time.Now()
	waitFor(t, memberTTL+10*time.Second, "the dead replica is still listed", func() bool {
		_, ok := memberURLs(t, a.Client)[bID]
		return !ok
	})
	// Its last renewal was at most a quarter TTL before the cut.
	if gone := time.Since(cut); gone < memberTTL*3/4-100*time.Millisecond {
		t.Errorf("dead replica dropped %v after its last chance to renew, before its TTL %v", gone, memberTTL)
	}
}

// TestMemberChangesAnswerAsEtcd: replicas join by starting and leave by
// stopping; the membership calls answer with etcd's errors.
func TestMemberChangesAnswerAsEtcd(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := pb.NewClusterClient(ts.Client.ActiveConnection())
	self := ts.Header().MemberID
	for _, c := range []struct {
		name string
		call func() error
		want error
	}{
		{"add without URLs", func() error { _, err := cl.MemberAdd(ctx, &pb.MemberAddRequest{}); return err }, rpctypes.ErrGRPCMemberBadURLs},
		{"add with a path", func() error {
			_, err := cl.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://10.0.0.1:2380/x"}})
			return err
		}, rpctypes.ErrGRPCMemberBadURLs},
		{"add", func() error {
			_, err := cl.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://10.0.0.1:2380"}})
			return err
		}, rpctypes.ErrGRPCNotCapable},
		{"remove unknown", func() error { _, err := cl.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: self + 1}); return err }, rpctypes.ErrGRPCMemberNotFound},
		{"remove self", func() error { _, err := cl.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: self}); return err }, rpctypes.ErrGRPCNotCapable},
		{"update unknown", func() error { _, err := cl.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: self + 1}); return err }, rpctypes.ErrGRPCMemberNotFound},
		{"promote unknown", func() error { _, err := cl.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: self + 1}); return err }, rpctypes.ErrGRPCMemberNotFound},
		{"promote a voter", func() error { _, err := cl.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: self}); return err }, rpctypes.ErrGRPCMemberNotLearner},
	} {
		if err := c.call(); err == nil || err.Error() != c.want.Error() {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}
