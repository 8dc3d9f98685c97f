//go:build fdbetcd_testhooks

package main

// Test-only hooks for the robustness suite (test/robustness), compiled only
// with the fdbetcd_testhooks build tag, the way etcd keeps its failpoints out
// of release builds: a release binary has neither the flags nor the
// subcommand (testhooks_release.go). Each flag says so in its usage, and all
// are off by default.
//
//	--experimental-storage-faults=retry=0.1,unknown=0.1,tooold=0.01,agejump=2s,seed=1
//	    wraps the backend in storage/faulty: conflicts that force a retry
//	    (retry), commits reported as commit_unknown_result (unknown), reads
//	    failing with transaction_too_old (tooold), and a clock that jumps 6 s
//	    forward every agejump so that every transaction in flight outlives
//	    FoundationDB's 5 s limit. The counts injected are logged every second
//	    until the store is closed.
//	--experimental-persisted-journal
//	    keeps mvcc.Journal, a copy of every persisted request that compaction
//	    never removes; `fdb-etcd experimental-export-persisted --data-dir D`
//	    (or --backend fdb --fdb-cluster-file F --fdb-prefix P) prints it (as
//	    JSON) once the servers have stopped.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/faulty"
)

type testHooks struct {
	faults  string
	journal bool
}

// registerTestFlags adds the test-only flags to fs.
func registerTestFlags(fs *flag.FlagSet, h *testHooks) {
	fs.StringVar(&h.faults, "experimental-storage-faults", "", "TEST ONLY: inject storage faults, e.g. retry=0.1,unknown=0.1,tooold=0.01,agejump=2s,seed=1")
	fs.BoolVar(&h.journal, "experimental-persisted-journal", false, "TEST ONLY: journal every persisted request for experimental-export-persisted (doubles writes)")
}

// parseFaults turns the --experimental-storage-faults value into options and
// the clock-jump period.
func parseFaults(s string) (faulty.Options, time.Duration, error) {
	o := faulty.Options{Seed: time.Now().UnixNano()}
	var jump time.Duration
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return o, 0, fmt.Errorf("--experimental-storage-faults: %q is not key=value", kv)
		}
		var err error
		switch k {
		case "retry":
			o.RetryProbability, err = strconv.ParseFloat(v, 64)
		case "unknown":
			o.CommitUnknownProbability, err = strconv.ParseFloat(v, 64)
		case "tooold":
			o.TooOldProbability, err = strconv.ParseFloat(v, 64)
		case "seed":
			o.Seed, err = strconv.ParseInt(v, 10, 64)
		case "agejump":
			jump, err = time.ParseDuration(v)
		default:
			err = fmt.Errorf("unknown fault %q", k)
		}
		if err != nil {
			return o, 0, fmt.Errorf("--experimental-storage-faults: %s: %w", kv, err)
		}
	}
	return o, jump, nil
}

// testSubcommand returns the test-only subcommand called name, nil if there
// is none.
func testSubcommand(name string) func(args []string, out io.Writer) error {
	if name == "experimental-export-persisted" {
		return exportPersisted
	}
	return nil
}

// wrap applies the hooks to a freshly opened backend: the journal innermost
// (so it records exactly what commits), the faults around it.
func (h *testHooks) wrap(db storage.DB, lg *zap.Logger) (storage.DB, error) {
	if h.journal {
		lg.Warn("TEST ONLY: persisted-request journal enabled")
		db = mvcc.Journal(db)
	}
	if h.faults == "" {
		return db, nil
	}
	o, jump, err := parseFaults(h.faults)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	f := &faultsDB{done: make(chan struct{}), stopped: make(chan struct{})}
	o.Now = f.now
	f.DB = faulty.Wrap(db, o)
	lg.Warn("TEST ONLY: injecting storage faults", zap.Float64("retry", o.RetryProbability),
		zap.Float64("unknown", o.CommitUnknownProbability), zap.Float64("too-old", o.TooOldProbability),
		zap.Duration("age-jump", jump), zap.Int64("seed", o.Seed))
	go f.report(lg, jump)
	return f, nil
}

// faultsDB is the fault-injecting store with its reporter: the goroutine
// that logs the counts and moves the clock runs until Close.
type faultsDB struct {
	*faulty.DB
	done    chan struct{} // closed by Close: the reporter stops
	stopped chan struct{} // closed by the reporter on its way out
	once    sync.Once

	mu   sync.Mutex
	skew time.Duration // guarded by mu: how far the faulty clock is ahead
}

func (f *faultsDB) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Add(f.skew)
}

// report logs the faults injected every second and, every jump, moves the
// store's clock past FoundationDB's transaction age limit.
func (f *faultsDB) report(lg *zap.Logger, jump time.Duration) {
	defer close(f.stopped)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var jumps int64
	last := time.Now()
	for {
		select {
		case <-f.done:
			return
		case <-tick.C:
		}
		if jump > 0 && time.Since(last) >= jump {
			f.mu.Lock()
			f.skew += storage.MaxTransactionAge + time.Second
			f.mu.Unlock()
			jumps++
			last = time.Now()
		}
		st := &f.DB.Stats
		lg.Warn("storage faults injected", zap.Int64("retries", st.Retries.Load()),
			zap.Int64("unknowns", st.Unknowns.Load()), zap.Int64("too-old", st.TooOld.Load()),
			zap.Int64("limit-errors", st.LimitErrors.Load()), zap.Int64("age-jumps", jumps))
	}
}

// Close stops the reporter, then closes the store.
func (f *faultsDB) Close() error {
	f.once.Do(func() { close(f.done) })
	<-f.stopped
	return f.DB.Close()
}

// exportPersisted is `fdb-etcd experimental-export-persisted`: it opens the
// store of stopped servers that ran with --experimental-persisted-journal
// (an embedded data dir, or a FoundationDB keyspace) and prints its
// journaled persisted requests.
func exportPersisted(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("experimental-export-persisted", flag.ContinueOnError)
	c := newEtcdConfig()
	fs.StringVar(&c.Dir, "data-dir", "default.etcd", "data directory of a stopped embedded server")
	fs.StringVar(&c.Backend, "backend", "pebble", "storage backend: pebble or fdb")
	fs.StringVar(&c.FDBClusterFile, "fdb-cluster-file", "/etc/foundationdb/fdb.cluster", "FoundationDB cluster file (backend fdb)")
	fs.StringVar(&c.FDBPrefix, "fdb-prefix", "fdb-etcd", "the keyspace's --fdb-prefix (backend fdb)")
	fs.IntVar(&c.FDBAPIVersion, "fdb-api-version", 730, "FoundationDB client API version (backend fdb)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.Backend != "fdb" {
		if _, err := os.Stat(c.Dir); err != nil {
			return err
		}
	}
	db, err := openBackend(c)
	if err != nil {
		return err
	}
	defer db.Close()
	reqs, err := mvcc.ExportPersisted(context.Background(), db)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	for _, r := range reqs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
