//go:build fdbetcd_testhooks

package main

import (
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

func TestParseFaults(t *testing.T) {
	o, jump, err := parseFaults("retry=0.1, unknown=0.2,tooold=0.01,agejump=2s,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	if o.RetryProbability != 0.1 || o.CommitUnknownProbability != 0.2 || o.TooOldProbability != 0.01 || o.Seed != 7 || jump != 2*time.Second {
		t.Fatalf("parsed %+v, jump %v", o, jump)
	}
	for _, bad := range []string{"retry", "retry=x", "bogus=1", "agejump=soon"} {
		if _, _, err := parseFaults(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c, err := parseFlags([]string{"--experimental-storage-faults=retry=0.5", "--experimental-persisted-journal"})
	if err != nil {
		t.Fatal(err)
	}
	if c.test.faults != "retry=0.5" || !c.test.journal {
		t.Fatalf("test hooks %+v", c.test)
	}
}

// TestFaultsReporterStopsOnClose: the goroutine that logs injected faults
// and moves the faulty clock ends when the store is closed.
func TestFaultsReporterStopsOnClose(t *testing.T) {
	before := runtime.NumGoroutine()
	db, err := pebble.Open(t.TempDir(), pebble.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	h := testHooks{faults: "retry=0.1,agejump=1s"}
	wrapped, err := h.wrap(db, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := wrapped.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not ordering events
	}
}
