//go:build fdb

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestClientBuggify runs the binary with FoundationDB's client-side fault
// injection on (--fdb-client-buggify) and writes through it from several
// clients: the client library fails and delays transactions and reports
// commits as commit_unknown_result, and still every acknowledged write is
// there exactly once, on its own revision, revisions stay dense, and
// /metrics counts the retries by FoundationDB error code.
func TestClientBuggify(t *testing.T) {
	cf := fdbtest.ClusterFile(t)
	prefix := fdbtest.NewPrefix(t)
	bin := buildFDBBinary(t)
	r := startReplica(t, bin, "buggify", cf, prefix, "--fdb-client-buggify",
		"--fdb-client-buggify-section-activated-probability", "100",
		"--fdb-client-buggify-section-fired-probability", "10")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base, err := r.cli.Get(ctx, "none")
	if err != nil {
		t.Fatal(err)
	}
	const clients, perClient = 8, 40
	var mu sync.Mutex
	acked := map[string]int64{}
	failed := 0
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range perClient {
				key := fmt.Sprintf("buggify/%d/%d", c, n)
				pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
				resp, err := r.cli.Put(pctx, key, key)
				pcancel()
				mu.Lock()
				if err == nil {
					acked[key] = resp.Header.Revision
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	all, err := r.cli.Get(ctx, "buggify/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := map[int64]string{}
	for _, kv := range all.Kvs {
		if kv.Version != 1 || string(kv.Value) != string(kv.Key) {
			t.Errorf("%s: version %d, value %q: written more than once or wrongly", kv.Key, kv.Version, kv.Value)
		}
		if other, dup := revs[kv.ModRevision]; dup {
			t.Errorf("%s and %s share revision %d", kv.Key, other, kv.ModRevision)
		}
		revs[kv.ModRevision] = string(kv.Key)
	}
	for key, rev := range acked {
		if revs[rev] != key {
			t.Errorf("acknowledged %s at revision %d; the store has %q there", key, rev, revs[rev])
		}
	}
	// Dense: every revision since the start is one of these puts.
	if n := all.Header.Revision - base.Header.Revision; n != int64(len(all.Kvs)) {
		t.Errorf("%d revisions for %d keys written", n, len(all.Kvs))
	}
	retries := retriesByCode(t, r)
	total := 0
	for _, n := range retries {
		total += n
	}
	t.Logf("%d puts acknowledged, %d failed (a failed put may have landed: %d keys stored); FoundationDB retries by code: %v",
		len(acked), failed, len(all.Kvs), retries)
	if total == 0 {
		t.Fatal("client buggify on, and no transaction retried")
	}
	if len(acked) < clients*perClient/2 {
		t.Fatalf("only %d of %d puts acknowledged", len(acked), clients*perClient)
	}
}

var retryLine = regexp.MustCompile(`(?m)^fdb_etcd_fdb_transaction_retries_total\{code="(\d+)"\} (\d+)$`)

func retriesByCode(t *testing.T, r *replica) map[int]int {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[int]int{}
	for _, m := range retryLine.FindAllStringSubmatch(string(b), -1) {
		code, _ := strconv.Atoi(m[1])
		n, _ := strconv.Atoi(m[2])
		out[code] = n
	}
	if !strings.Contains(string(b), "fdb_etcd_fdb_read_version_duration_seconds_count") {
		t.Fatal("/metrics has no fdb_etcd_fdb_read_version_duration_seconds")
	}
	return out
}
