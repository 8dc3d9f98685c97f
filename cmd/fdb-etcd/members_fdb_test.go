//go:build fdb

package main

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestMemberListAcrossProcesses: three fdb-etcd processes on one keyspace
// each list all three, so a client that syncs its endpoints from
// MemberList spreads over them; a process killed with SIGKILL (no chance to
// deregister) leaves the list once its record's TTL runs out, and, started
// again under its name, comes back with its old id and its new URL.
func TestMemberListAcrossProcesses(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	prefix := fdbtest.NewPrefix(t)
	bin := buildFDBBinary(t)
	a := startReplica(t, bin, "a", cf, prefix)
	b := startReplica(t, bin, "b", cf, prefix)
	c := startReplica(t, bin, "c", cf, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + a.addr}, AutoSyncInterval: 200 * time.Millisecond,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	all := []string{"http://" + a.addr, "http://" + b.addr, "http://" + c.addr}
	slices.Sort(all)
	waitUntil(t, 30*time.Second, "the auto-syncing client learns every replica", func() bool {
		e := slices.Clone(cli.Endpoints())
		slices.Sort(e)
		return slices.Equal(e, all)
	})

	members := func() map[string]uint64 {
		resp, err := a.cli.MemberList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, m := range resp.Members {
			out[m.Name] = m.ID
			if len(m.ClientURLs) != 1 {
				t.Fatalf("member %v", m)
			}
		}
		return out
	}
	cID := members()["c"]
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitUntil(t, cluster.DefaultMemberTTL+20*time.Second, "the killed replica leaves the list", func() bool {
		_, ok := members()["c"]
		return !ok
	})
	if gone := time.Since(killed); gone < cluster.DefaultMemberTTL/2 {
		t.Errorf("killed replica dropped after %v, before its TTL could run out", gone)
	}
	t.Logf("killed replica left the member list %v after SIGKILL (TTL %v)", time.Since(killed).Round(time.Millisecond), cluster.DefaultMemberTTL)
	waitUntil(t, 30*time.Second, "the auto-syncing client drops the killed replica", func() bool {
		return len(cli.Endpoints()) == 2
	})

	c2 := startReplica(t, bin, "c", cf, prefix)
	if id := members()["c"]; id != cID {
		t.Fatalf("restarted replica has id %x, had %x", id, cID)
	}
	resp, err := c2.cli.MemberList(ctx)
	if err != nil || len(resp.Members) != 3 {
		t.Fatalf("MemberList on the restarted replica: %v, %v", resp, err)
	}
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
