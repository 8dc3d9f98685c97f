package main

import (
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

type config struct {
	server      server.Config
	dataDir     string
	backend     string
	logLevel    string
	logFormat   string
	showVersion bool

	fdbClusterFile string
	fdbPrefix      string
	fdbAPIVersion  int
	forwardWrites  bool
	fdbBuggify     fdb.ClientBuggify

	test testHooks // test-only hooks (testhooks.go)
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("fdb-etcd", flag.ContinueOnError)
	var c config
	var listen, advertise string
	fs.StringVar(&c.server.Name, "name", "default", "human-readable name for this member")
	fs.StringVar(&c.dataDir, "data-dir", "", "path to the data directory of the embedded backend (default ${name}.etcd)")
	fs.StringVar(&listen, "listen-client-urls", "http://127.0.0.1:2379", "comma-separated URLs to listen on for client traffic")
	fs.StringVar(&advertise, "advertise-client-urls", "", "comma-separated client URLs to advertise (default: the listen URLs)")
	maxReq := fs.Uint("max-request-bytes", 1.5*1024*1024, "maximum client request size in bytes the server will accept")
	fs.IntVar(&c.server.MaxTxnOps, "max-txn-ops", 128, "maximum number of operations permitted in a transaction")
	heartbeat := fs.Uint("heartbeat-interval", 100, "time (in milliseconds) of a heartbeat interval; with --election-timeout it sets the minimum lease TTL as in etcd")
	election := fs.Uint("election-timeout", 1000, "time (in milliseconds) for an election to timeout; leases are extended by it when lease expiry changes hands")
	fs.DurationVar(&c.server.GRPCKeepAliveMinTime, "grpc-keepalive-min-time", 5*time.Second, "minimum interval a client should wait before pinging the server")
	fs.DurationVar(&c.server.GRPCKeepAliveInterval, "grpc-keepalive-interval", 2*time.Hour, "frequency of server-to-client pings to check if a connection is alive (0 to disable)")
	fs.DurationVar(&c.server.GRPCKeepAliveTimeout, "grpc-keepalive-timeout", 20*time.Second, "additional wait after a keepalive ping before closing a non-responsive connection")
	fs.DurationVar(&c.server.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long SIGTERM waits for in-flight requests before closing them")
	fs.BoolVar(&c.server.EnablePprof, "enable-pprof", false, "enable runtime profiling data via HTTP server under /debug/pprof/ on the client port")
	fs.DurationVar(&c.server.Watch.ProgressNotifyInterval, "watch-progress-notify-interval", 10*time.Minute, "duration of periodic watch progress notifications")
	fs.DurationVar(&c.server.Watch.ProgressNotifyInterval, "experimental-watch-progress-notify-interval", 10*time.Minute, "duration of periodic watch progress notifications (etcd's deprecated name for --watch-progress-notify-interval)")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error, panic, or fatal")
	fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&c.backend, "backend", "pebble", "storage backend: pebble (embedded) or fdb (FoundationDB)")
	fs.StringVar(&c.fdbClusterFile, "fdb-cluster-file", "/etc/foundationdb/fdb.cluster", "FoundationDB cluster file (backend fdb)")
	fs.StringVar(&c.fdbPrefix, "fdb-prefix", "fdb-etcd", "key prefix of this keyspace inside FoundationDB (backend fdb)")
	fs.IntVar(&c.fdbAPIVersion, "fdb-api-version", 730, "FoundationDB client API version (backend fdb)")
	fs.BoolVar(&c.forwardWrites, "fdb-forward-writes", true, "send writes to the one replica that currently owns revision allocation, so replicas sharing a keyspace do not conflict on it (backend fdb); peers dial each other's first --advertise-client-urls")
	fs.BoolVar(&c.fdbBuggify.Enable, "fdb-client-buggify", false, "TESTING AID, never in production: turn on FoundationDB's client-side fault injection (client_buggify_enable): the client library fails requests at random with retryable errors and commit_unknown_result, and delays them (backend fdb)")
	fs.IntVar(&c.fdbBuggify.SectionActivatedPercent, "fdb-client-buggify-section-activated-probability", 0, "with --fdb-client-buggify: percent chance that each fault-injection section is active in this process (0: FoundationDB's default)")
	fs.IntVar(&c.fdbBuggify.SectionFiredPercent, "fdb-client-buggify-section-fired-probability", 0, "with --fdb-client-buggify: percent chance that an active section fires each time it is reached (0: FoundationDB's default)")
	fs.BoolVar(&c.showVersion, "version", false, "print the version and exit")
	finishOps := registerOpsFlags(fs, &c)
	finishAPI := registerAPIFlags(fs, &c)
	registerTestFlags(fs, &c.test)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c.server.MaxRequestBytes = int(*maxReq)
	finishAPI()
	if err := leaseTiming(&c.server, *heartbeat, *election); err != nil {
		return nil, err
	}
	var err error
	if c.server.ListenClientURLs, err = parseURLs(listen); err != nil {
		return nil, fmt.Errorf("--listen-client-urls: %w", err)
	}
	if advertise == "" {
		c.server.AdvertiseClientURLs = c.server.ListenClientURLs
	} else if c.server.AdvertiseClientURLs, err = parseURLs(advertise); err != nil {
		return nil, fmt.Errorf("--advertise-client-urls: %w", err)
	}
	if err := finishOps(); err != nil {
		return nil, err
	}
	if c.dataDir == "" {
		c.dataDir = c.server.Name + ".etcd"
	}
	if err := checkBuggify(&c); err != nil {
		return nil, err
	}
	switch c.backend {
	case "pebble":
	case "fdb":
		// Only a shared backend has other replicas to forward to.
		c.server.ForwardWrites = c.forwardWrites
	default:
		return nil, fmt.Errorf("--backend: unknown backend %q (want pebble or fdb)", c.backend)
	}
	return &c, nil
}

func parseURLs(s string) ([]url.URL, error) {
	var out []url.URL
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		u, err := url.Parse(part)
		if err != nil {
			return nil, err
		}
		if u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs" {
			return nil, fmt.Errorf("URL %q: scheme must be http or https", part)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("URL %q: no host", part)
		}
		out = append(out, *u)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no URLs given")
	}
	return out, nil
}

func urlList(us []url.URL) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}

// leaseTiming derives the lessor's minimum TTL and promotion extension from
// etcd's raft timing flags, with etcd's formulas and validation: the minimum
// TTL is 1.5 election timeouts in whole heartbeats, rounded up to seconds.
func leaseTiming(c *server.Config, heartbeatMs, electionMs uint) error {
	if heartbeatMs == 0 || electionMs == 0 {
		return fmt.Errorf("--heartbeat-interval and --election-timeout must be positive")
	}
	if 5*heartbeatMs > electionMs {
		return fmt.Errorf("--election-timeout[%vms] should be at least as 5 times as --heartbeat-interval[%vms]", electionMs, heartbeatMs)
	}
	ticks := electionMs / heartbeatMs
	minTTL := time.Duration((3*ticks)/2*heartbeatMs) * time.Millisecond
	c.Lease.MinTTL = int64((minTTL + time.Second - 1) / time.Second)
	c.Lease.Extend = time.Duration(electionMs) * time.Millisecond
	return nil
}

// checkBuggify refuses client fault-injection settings that would be
// ignored or that FoundationDB would refuse.
func checkBuggify(c *config) error {
	b := c.fdbBuggify
	if !b.Enable && (b.SectionActivatedPercent != 0 || b.SectionFiredPercent != 0) {
		return fmt.Errorf("--fdb-client-buggify-section-*-probability needs --fdb-client-buggify")
	}
	if b.Enable && c.backend != "fdb" {
		return fmt.Errorf("--fdb-client-buggify needs --backend=fdb")
	}
	for _, p := range []int{b.SectionActivatedPercent, b.SectionFiredPercent} {
		if p < 0 || p > 100 {
			return fmt.Errorf("--fdb-client-buggify-section-*-probability: %d is not a percentage", p)
		}
	}
	return nil
}
