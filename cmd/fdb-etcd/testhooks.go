package main

// Test-only hooks for the robustness suite (test/robustness). None of them is
// meant for production; each flag says so in its usage, and all are off by
// default.
//
//	--experimental-storage-faults=retry=0.1,unknown=0.1,tooold=0.01,agejump=2s,seed=1
//	    wraps the backend in storage/faulty: conflicts that force a retry
//	    (retry), commits reported as commit_unknown_result (unknown), reads
//	    failing with transaction_too_old (tooold), and a clock that jumps 6 s
//	    forward every agejump so that every transaction in flight outlives
//	    FoundationDB's 5 s limit. The counts injected are logged every second.
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
	var mu sync.Mutex
	var skew time.Duration
	o.Now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Add(skew)
	}
	f := faulty.Wrap(db, o)
	lg.Warn("TEST ONLY: injecting storage faults", zap.Float64("retry", o.RetryProbability),
		zap.Float64("unknown", o.CommitUnknownProbability), zap.Float64("too-old", o.TooOldProbability),
		zap.Duration("age-jump", jump), zap.Int64("seed", o.Seed))
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var jumps int64
		last := time.Now()
		for range tick.C {
			if jump > 0 && time.Since(last) >= jump {
				mu.Lock()
				skew += storage.MaxTransactionAge + time.Second
				mu.Unlock()
				jumps++
				last = time.Now()
			}
			lg.Warn("storage faults injected", zap.Int64("retries", f.Stats.Retries.Load()),
				zap.Int64("unknowns", f.Stats.Unknowns.Load()), zap.Int64("too-old", f.Stats.TooOld.Load()),
				zap.Int64("limit-errors", f.Stats.LimitErrors.Load()), zap.Int64("age-jumps", jumps))
		}
	}()
	return f, nil
}

// exportPersisted is `fdb-etcd experimental-export-persisted`: it opens the
// store of stopped servers that ran with --experimental-persisted-journal
// (an embedded data dir, or a FoundationDB keyspace) and prints its
// journaled persisted requests.
func exportPersisted(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("experimental-export-persisted", flag.ContinueOnError)
	var c config
	fs.StringVar(&c.dataDir, "data-dir", "default.etcd", "data directory of a stopped embedded server")
	fs.StringVar(&c.backend, "backend", "pebble", "storage backend: pebble or fdb")
	fs.StringVar(&c.fdbClusterFile, "fdb-cluster-file", "/etc/foundationdb/fdb.cluster", "FoundationDB cluster file (backend fdb)")
	fs.StringVar(&c.fdbPrefix, "fdb-prefix", "fdb-etcd", "the keyspace's --fdb-prefix (backend fdb)")
	fs.IntVar(&c.fdbAPIVersion, "fdb-api-version", 730, "FoundationDB client API version (backend fdb)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.backend != "fdb" {
		if _, err := os.Stat(c.dataDir); err != nil {
			return err
		}
	}
	db, err := openBackend(&c)
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
