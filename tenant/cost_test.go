package tenant

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// goroutineDump groups the process's goroutines by what they wait in: the
// innermost frame of this module, else of gRPC, else the innermost frame.
func goroutineDump(t *testing.T) map[string]int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	head := regexp.MustCompile(`^(\d+) @`)
	for _, blk := range strings.Split(buf.String(), "\n\n") {
		lines := strings.Split(strings.TrimSpace(blk), "\n")
		for len(lines) > 0 && !head.MatchString(lines[0]) {
			lines = lines[1:] // the profile's own header, before the first group
		}
		if len(lines) == 0 {
			continue
		}
		n, _ := strconv.Atoi(head.FindStringSubmatch(lines[0])[1])
		out[whereWaiting(lines[1:])] += n
	}
	return out
}

func whereWaiting(frames []string) string {
	var names []string
	for _, l := range frames {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" {
			name, _, _ := strings.Cut(f[2], "+0x") // the offset differs between builds
			names = append(names, name)
		}
	}
	for _, pkg := range []string{"github.com/fdb-etcd/fdb-etcd/", "google.golang.org/grpc"} {
		for _, n := range names {
			if strings.HasPrefix(n, pkg) && !slices.ContainsFunc(waitHelpers, func(h string) bool { return strings.HasPrefix(n, h) }) {
				return n
			}
		}
	}
	if len(names) > 0 {
		return names[0]
	}
	return "?"
}

// waitHelpers are frames every kind of waiting goes through; the dump names
// their callers.
var waitHelpers = []string{
	"github.com/fdb-etcd/fdb-etcd/storage/",
	"github.com/fdb-etcd/fdb-etcd/internal/clock.",
	"github.com/fdb-etcd/fdb-etcd/tenant.(*DB)",
	"github.com/fdb-etcd/fdb-etcd/server/metrics.(*measuredDB)",
}

// grew is what after has beyond before, largest first, as lines.
func grew(before, after map[string]int) (lines []string, total int) {
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			lines = append(lines, fmt.Sprintf("%4d %s", d, k))
			total += d
		}
	}
	slices.Sort(lines)
	slices.Reverse(lines)
	return lines, total
}

// TestQuietTenantGoroutines lists what a connected tenant that sends
// nothing runs (the test's log shows the dump), and holds it to a budget:
// no pool of gRPC handler goroutines, which was 64 of its 79.
func TestQuietTenantGoroutines(t *testing.T) {
	e := startRouter(t, false)
	e.create("alice", "bob")
	must(e.client("alice").Put(ctxT(t), "k", "v"))(t) // a running tenant and a client: the baseline
	before := goroutineDump(t)
	must(e.client("bob").Put(ctxT(t), "k", "v"))(t)
	after := goroutineDump(t)
	lines, total := grew(before, after)
	t.Logf("a quiet tenant's server and its client's connection: %d goroutines\n%s", total, strings.Join(lines, "\n"))
	if n := after["google.golang.org/grpc.(*Server).serverWorker"]; n != 0 {
		t.Errorf("%d gRPC stream workers wait in tenants' servers", n)
	}
	if reg := "github.com/fdb-etcd/fdb-etcd/server/cluster.(*Registry).run"; after[reg] != before[reg] {
		n := after[reg] - before[reg]
		t.Errorf("%d member records renewed for tenants: the replica's is theirs", n)
	}
	if tail := "github.com/fdb-etcd/fdb-etcd/mvcc.(*Store).WaitRev"; after[tail] != before[tail] {
		t.Errorf("a tenant nobody watches tails the revision log (%d watch hubs)", after[tail]-before[tail])
	}
	if gw := "github.com/fdb-etcd/fdb-etcd/server/gateway.(*pipeListener).Accept"; after[gw] != before[gw] {
		t.Errorf("a tenant no JSON client asked serves a JSON gateway (%d)", after[gw]-before[gw])
	}
	const budget = 30 // the server's 16 or so and the client connection's 10
	if total > budget {
		t.Errorf("a quiet tenant costs %d goroutines, over %d", total, budget)
	}
}

// TestTenantGRPCSeriesOnFirstUse: a tenant's server holds gRPC series only
// for the methods it was called with, not every method's at zero (some
// 400 KiB per tenant).
func TestTenantGRPCSeriesOnFirstUse(t *testing.T) {
	e := startRouter(t, false)
	e.create("alice")
	must(e.client("alice").Put(ctxT(t), "k", "v"))(t)
	e.router.mu.Lock()
	inst := e.router.tenants["alice"]
	e.router.mu.Unlock()
	rec := httptest.NewRecorder()
	inst.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var methods []string
	for _, m := range regexp.MustCompile(`(?m)^grpc_server_handled_total\{[^}]*grpc_method="(\w+)"`).FindAllStringSubmatch(rec.Body.String(), -1) {
		if !slices.Contains(methods, m[1]) {
			methods = append(methods, m[1])
		}
	}
	if len(methods) != 1 || methods[0] != "Put" {
		t.Fatalf("grpc_server_handled_total has series of %v; want Put's only", methods)
	}
}

// TestWatchHubOnDemand: a tenant's watch hub runs only while the tenant
// has watch streams, and a hub started again serves watches from past
// revisions as the first one did.
func TestWatchHubOnDemand(t *testing.T) {
	e := startRouter(t, false)
	e.create("alice")
	cli := e.client("alice")
	must(cli.Put(ctxT(t), "a", "1"))(t)
	if hubsRunning(t) != 0 {
		t.Fatal("a tenant nobody watches runs a watch hub")
	}
	for round := range 2 {
		wctx, cancel := context.WithCancel(ctxT(t))
		w := cli.Watch(clientv3.WithRequireLeader(wctx), "", clientv3.WithPrefix(), clientv3.WithRev(1))
		must(cli.Put(ctxT(t), "b", fmt.Sprint(round)))(t)
		var keys []string
		for len(keys) < 2+round {
			resp, ok := <-w
			if !ok {
				t.Fatalf("round %d: the watch ended after %v", round, keys)
			}
			for _, ev := range resp.Events {
				keys = append(keys, string(ev.Kv.Key))
			}
		}
		if hubsRunning(t) != 1 {
			t.Fatalf("round %d: a watched tenant runs no hub", round)
		}
		cancel()
		deadline := time.Now().Add(time.Minute)
		for hubsRunning(t) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the hub still runs a minute after the last watch closed", round)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// hubsRunning counts the watch hubs tailing a revision log in this process.
func hubsRunning(t *testing.T) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Count(buf.String(), "watchhub.(*Hub).run(")
}
