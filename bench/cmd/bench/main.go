// Command bench compares fdb-etcd with etcd and kine: it builds (or reuses)
// the servers, then for each one in turn starts it on a fresh temp data dir
// on loopback, runs every workload against it with the etcd clientv3
// client, and stops it. It prints a markdown table to stdout and writes it
// to -out. With FDB_CLUSTER_FILE set it also runs fdb-etcd on FoundationDB,
// with one replica and with three.
//
//	cd bench && go run ./cmd/bench -out results.md          # full run
//	cd bench && go run ./cmd/bench -quick -out quick.md     # smoke test
//	cd bench && go run ./cmd/bench -servers etcd,kine -workloads put,list
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/report"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/servers"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	servers      []string
	allServers   bool // no -servers flag
	groups       []string
	quick        bool
	out          string
	jsonOut      string
	base         string
	fdbBin       string
	fdbTaggedBin string
	binDir       string
	workDir      string
	keep         bool
	restartEach  bool
	rebuildTools bool
	timeout      time.Duration
	duration     time.Duration
	objects      int
	watchers     []int
	pprof        bool
	cpuProfile   string
	settle       time.Duration
	serverCPUs   string
	watchRates   []int
	noisySlots   []int
}

func parseFlags() (options, error) {
	var o options
	var srv, groups string
	flag.StringVar(&srv, "servers", "", "comma-separated servers to run, in order, of "+strings.Join(servers.Known, ",")+
		" (default all; those on FoundationDB only when "+servers.EnvClusterFile+" is set)")
	flag.StringVar(&groups, "workloads", "all", "comma-separated workload groups: all or any of put,range,txn,list,watch,progress,rss,lease,large,noisy")
	flag.BoolVar(&o.quick, "quick", false, "small counts and short runs (CI smoke test)")
	flag.StringVar(&o.out, "out", "results.md", "markdown output file (\"\" = stdout only)")
	flag.StringVar(&o.jsonOut, "json", "", "also write raw results as JSON to this file")
	flag.StringVar(&o.base, "base", servers.FDBEtcd, "server whose ratios against the others are reported")
	flag.StringVar(&o.fdbBin, "fdb-etcd-bin", "", "use this fdb-etcd binary instead of building ./cmd/fdb-etcd")
	flag.StringVar(&o.fdbTaggedBin, "fdb-etcd-fdb-bin", "", "use this fdb-etcd binary (built with -tags fdb) for the FoundationDB servers")
	flag.StringVar(&o.binDir, "bin-dir", "", "binary cache directory (default bench/.bin)")
	flag.StringVar(&o.workDir, "workdir", "", "parent directory of the servers' temp data dirs (default $TMPDIR)")
	flag.BoolVar(&o.keep, "keep", false, "keep the servers' data dirs, logs and FoundationDB keyspaces")
	flag.BoolVar(&o.restartEach, "restart-each", false, "restart each server on a fresh data dir before every workload")
	flag.BoolVar(&o.rebuildTools, "rebuild-tools", false, "rebuild etcd and kine even if cached")
	flag.DurationVar(&o.timeout, "timeout", 0, "overall time limit (default 2h, or 15m with -quick)")
	flag.DurationVar(&o.duration, "duration", 0, "override the length of each time-bounded throughput run")
	flag.IntVar(&o.objects, "objects", 0, "override the object count of the create-txn and LIST workloads")
	flag.BoolVar(&o.pprof, "pprof", false, "serve /debug/pprof on etcd's and fdb-etcd's client port (profile a run by hand)")
	flag.StringVar(&o.serverCPUs, "server-cpus", "", "pin the servers to these CPUs with taskset (e.g. 0); run the harness itself under taskset on the others")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write the harness's own CPU profile (the load generator) to this file")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "before each server start, flush dirty pages (sync) and wait this long, so one server's leftovers do not slow the next one's fsync-bound rows")
	var watchers, rates, noisySlots string
	flag.StringVar(&watchers, "watchers", "", "override the watcher counts of the watch fan-out rows (comma-separated)")
	flag.StringVar(&rates, "watch-rates", "", "override the write rates of the watch fan-out rows (comma-separated, writes/s)")
	flag.StringVar(&noisySlots, "noisy-slots", "", "override the --tenant-max-concurrent-requests values the noisy rows run with (comma-separated; 0: no fair scheduler)")
	flag.Parse()
	if flag.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	if srv == "" {
		o.servers = servers.Default()
		o.allServers = true
	}
	for _, s := range strings.Split(srv, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(servers.Known, s) {
			return o, fmt.Errorf("unknown server %q (known: %s)", s, strings.Join(servers.Known, ","))
		}
		if servers.NeedsFDB(s) {
			if _, err := servers.ClusterFile(); err != nil {
				return o, fmt.Errorf("server %s runs on FoundationDB: %w", s, err)
			}
		}
		if !slices.Contains(o.servers, s) {
			o.servers = append(o.servers, s)
		}
	}
	if len(o.servers) == 0 {
		return o, errors.New("no server selected")
	}
	for _, g := range strings.Split(groups, ",") {
		if g = strings.TrimSpace(g); g != "" && g != "all" {
			o.groups = append(o.groups, g)
		}
	}
	var err error
	if o.watchers, err = parseInts(watchers); err != nil {
		return o, fmt.Errorf("-watchers: %w", err)
	}
	if o.noisySlots, err = parseIntsFrom(noisySlots, 0); err != nil {
		return o, fmt.Errorf("-noisy-slots: %w", err)
	}
	if o.watchRates, err = parseInts(rates); err != nil {
		return o, fmt.Errorf("-watch-rates: %w", err)
	}
	if o.timeout == 0 {
		o.timeout = 2 * time.Hour
		if o.quick {
			o.timeout = 15 * time.Minute
		}
	}
	return o, nil
}

// settleHost lets the previous server's I/O drain: its data dir was just
// deleted and the kernel may still be writing its dirty pages, which showed
// as a slower 1-client put row for whichever server came next.
func settleHost(d time.Duration) {
	syscall.Sync()
	time.Sleep(d)
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) { return parseIntsFrom(s, 1) }

// parseIntsFrom parses a comma-separated list of integers >= least.
func parseIntsFrom(s string, least int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < least {
			return nil, fmt.Errorf("%q is not an integer >= %d", f, least)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	p := workload.Full()
	if o.quick {
		p = workload.Quick()
	}
	if o.duration > 0 {
		p.Duration = o.duration
	}
	if o.objects > 0 {
		p.Objects = o.objects
	}
	if len(o.watchers) > 0 {
		p.Watchers = o.watchers
	}
	if len(o.noisySlots) > 0 {
		p.NoisySlots = o.noisySlots
	}
	if len(o.watchRates) > 0 {
		p.WatchRates = o.watchRates
	}
	var ws []workload.Workload
	known := map[string]bool{}
	for _, w := range workload.All(p) {
		known[w.Group()] = true
		if len(o.groups) == 0 || slices.Contains(o.groups, w.Group()) {
			ws = append(ws, w)
		}
	}
	for _, g := range o.groups {
		if !known[g] {
			return fmt.Errorf("unknown workload group %q", g)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	layout, err := servers.FindLayout(o.binDir)
	if err != nil {
		return err
	}
	bins, err := servers.Build(ctx, layout, o.servers, servers.BuildOptions{
		FDBEtcdBin:   o.fdbBin,
		FDBTaggedBin: o.fdbTaggedBin,
		ForceTools:   o.rebuildTools,
		Logf:         logf,
	})
	if err != nil {
		return err
	}

	mode := "full"
	if o.quick {
		mode = "quick"
	}
	rep := report.New("fdb-etcd benchmark", o.servers, o.base)
	rep.Cores = runtime.NumCPU()
	rep.Header = header(layout, o, mode)
	rep.Comparisons = []report.Comparison{fdbComparison()}
	runStart := time.Now()
	var loads []string
	for _, name := range o.servers {
		if ctx.Err() != nil {
			break
		}
		loads = append(loads, name+" "+loadAvg())
		results := runServer(ctx, name, bins[name], ws, p, o)
		for _, r := range results {
			rep.Add(r)
		}
	}
	rep.Header = append(rep.Header,
		"1-min load average when each server started (other work on the host skews results): "+strings.Join(loads, ", "),
		fmt.Sprintf("total run time: %s", time.Since(runStart).Round(time.Second)))
	if ctx.Err() != nil {
		rep.Header = append(rep.Header, "**run interrupted or timed out: "+ctx.Err().Error()+"**")
	}

	var buf bytes.Buffer
	rep.Markdown(&buf)
	os.Stdout.Write(buf.Bytes())
	if o.out != "" {
		if err := os.WriteFile(o.out, buf.Bytes(), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.out)
	}
	if o.jsonOut != "" {
		var all []workload.Result
		for _, row := range rep.Rows {
			for _, s := range o.servers {
				if r, ok := rep.Results[row][s]; ok {
					all = append(all, r)
				}
			}
		}
		b, err := json.MarshalIndent(map[string]any{"header": rep.Header, "results": all, "comparisons": rep.ComparisonRatios()}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// runServer runs every workload against one server, starting it fresh (and
// restarting it where a workload asks for that or the server died).
func runServer(ctx context.Context, name, bin string, ws []workload.Workload, p workload.Params, o options) []workload.Result {
	var results []workload.Result
	na := func(w workload.Workload, why string) {
		results = append(results, workload.Result{Server: name, Row: w.Name(), Group: w.Group(), NA: why})
	}
	var inst *servers.Instance
	used := false
	tenantInst := false // inst serves tenants
	stopInst := func() {
		if inst != nil {
			if o.keep {
				logf("[%s] kept %s", name, inst.Dir)
				if inst.Prefix != "" {
					logf("[%s] kept FoundationDB keyspace %s", name, inst.Prefix)
				}
			}
			if err := inst.Stop(); err != nil {
				logf("[%s] stop: %v", name, err)
			}
			inst = nil
		}
	}
	defer stopInst()
	perWorkload := 20 * time.Minute
	if p.Quick {
		perWorkload = 3 * time.Minute
	}
	for _, w := range ws {
		if ctx.Err() != nil {
			na(w, "not run: "+ctx.Err().Error())
			continue
		}
		fresh := o.restartEach
		if f, ok := w.(workload.FreshServer); ok && f.FreshServer() {
			// The plain client serves no one: nothing to measure fresh.
			fresh = fresh || !servers.IsRaw(name)
		}
		// A row of tenants gets a server of its own, started to serve
		// them, and the next row a plain one again. The plain client has
		// no server: its cell says why it has no equivalent.
		tw, tenanted := w.(workload.TenantServer)
		tenanted = tenanted && !servers.IsRaw(name)
		if tenanted && !servers.SupportsTenancy(name) {
			na(w, "no tenancy: "+name+" serves one keyspace")
			continue
		}
		fresh = fresh || tenanted || tenantInst
		if inst != nil && !inst.Alive() {
			logf("[%s] server died; log tail:\n%s", name, inst.LogTail(20))
			stopInst()
		}
		if inst != nil && fresh && used {
			stopInst()
		}
		if inst == nil {
			settleHost(o.settle)
			var err error
			t0 := time.Now()
			so := servers.StartOptions{WorkDir: o.workDir, Keep: o.keep, Pprof: o.pprof, CPUs: o.serverCPUs}
			if tenanted {
				so.Tenancy, so.Args = true, tw.TenantServerArgs()
			}
			inst, err = servers.Start(ctx, name, bin, so)
			tenantInst = tenanted
			if err != nil {
				logf("[%s] start failed: %v", name, err)
				na(w, "server failed to start: "+firstLine(err.Error()))
				continue
			}
			used = false
			if servers.IsRaw(name) {
				logf("[%s] keyspace %s", name, inst.Prefix)
			} else {
				logf("[%s] started pid %v on %s in %s", name, inst.PIDs(), strings.Join(inst.Endpoints, ","), time.Since(t0).Round(time.Millisecond))
			}
		}
		results = append(results, measure(ctx, name, bin, inst, w, p, perWorkload))
		used = true
	}
	return results
}

// measure runs one row on a running server (or, for the plain FoundationDB
// client, in its keyspace) within limit; a failure is an n/a result.
func measure(ctx context.Context, name, bin string, inst *servers.Instance, w workload.Workload, p workload.Params, limit time.Duration) workload.Result {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	t0 := time.Now()
	var res workload.Result
	var err error
	if servers.IsRaw(name) {
		res, err = runRaw(wctx, name, bin, inst, w, p)
	} else {
		res, err = w.Run(wctx, &workload.Env{Server: name, Endpoints: inst.Endpoints, PIDs: inst.PIDs(), P: p, Logf: logf,
			ClientTLS: inst.ClientTLS})
	}
	if err != nil {
		why := workload.ShortErr(err)
		if workload.IsUnsupported(err) {
			why = "unsupported: " + why
		}
		if !inst.Alive() {
			why = "server died: " + why
		}
		logf("[%s] %-70s n/a (%s)", name, w.Name(), why)
		return workload.Result{Server: name, Row: w.Name(), Group: w.Group(), NA: why}
	}
	res.Server, res.Row, res.Group = name, w.Name(), w.Group()
	logf("[%s] %-70s %s (%s)", name, w.Name(), summary(res), time.Since(t0).Round(time.Millisecond))
	return res
}

func summary(r workload.Result) string {
	if r.NoEquivalent != "" {
		return "– (" + r.NoEquivalent + ")"
	}
	switch r.Kind {
	case workload.Throughput:
		return fmt.Sprintf("%.0f ops/s p50 %s p99 %s errors %d", r.Value, r.P50, r.P99, r.Errors)
	case workload.Time:
		return fmt.Sprintf("%s p99 %s; %s", time.Duration(r.Value*float64(time.Second)), r.P99, r.Note)
	case workload.Bytes:
		return fmt.Sprintf("%.1f MiB; %s", r.Value/(1<<20), r.Note)
	}
	return ""
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func header(l servers.Layout, o options, mode string) []string {
	h := []string{
		fmt.Sprintf("date: %s, mode: %s", time.Now().UTC().Format("2006-01-02 15:04 UTC"), mode),
		fmt.Sprintf("host: %d CPUs, %s, %s/%s; load generator in the same host (etcd clientv3; raw gRPC watch streams for the fan-out rows), servers run one at a time on loopback", runtime.NumCPU(), memTotal(), runtime.GOOS, runtime.GOARCH),
	}
	var vs []string
	fdb := false
	for _, s := range o.servers {
		switch s {
		case servers.FDBEtcd:
			vs = append(vs, "fdb-etcd "+gitRev(l.RepoRoot)+" (default Pebble store)")
		case servers.FDBEtcdFDB:
			vs = append(vs, "fdb-etcd-fdb (the same, built with -tags fdb, on FoundationDB, 1 replica)")
			fdb = true
		case servers.FDBEtcdFDB3:
			vs = append(vs, "fdb-etcd-fdb3 (3 replicas of one FoundationDB keyspace, clients round-robin over them)")
			fdb = true
		case servers.FDBRaw:
			vs = append(vs, "fdb-raw (a plain FoundationDB client, Go bindings API 730, a process of its own on the same cluster: the least FoundationDB work each row needs, one transaction per operation)")
			fdb = true
		case servers.FDBRawBatched:
			vs = append(vs, "fdb-raw-batched (the same, concurrent write operations group-committed as fdb-etcd batches them)")
			fdb = true
		default:
			vs = append(vs, s+" "+servers.Versions[s])
		}
	}
	h = append(h, "servers: "+strings.Join(vs, ", "))
	if !fdb && o.allServers {
		h = append(h, "FoundationDB servers ("+servers.FDBEtcdFDB+", "+servers.FDBEtcdFDB3+", "+servers.FDBRaw+", "+servers.FDBRawBatched+") not run: "+servers.EnvClusterFile+" is not set")
	}
	if fdb {
		// The cluster's shape matters as much as fdb-etcd's: a single
		// in-memory test server is not a production cluster.
		if cf, err := servers.ClusterFile(); err == nil {
			h = append(h, "FoundationDB cluster ("+servers.EnvClusterFile+"): "+servers.FDBStatus(cf)+"; a fresh keyspace per server start")
		}
	}
	return h
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "memory unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return fmt.Sprintf("%.0f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return "memory unknown"
}

func gitRev(dir string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = dir
	cmd.Stderr = io.Discard
	b, err := cmd.Output()
	if err != nil {
		return "(unknown revision)"
	}
	return strings.TrimSpace(string(b))
}

// fdbComparison is the report's FoundationDB table: fdb-etcd on
// FoundationDB against etcd and against what a plain FoundationDB client
// gets from the same cluster.
func fdbComparison() report.Comparison {
	return report.Comparison{
		Title: "fdb-etcd on FoundationDB against etcd and a plain FoundationDB client",
		Text: "fdb-raw does the least FoundationDB work each row's logical operation needs, one transaction per operation; " +
			"fdb-raw-batched group-commits the write rows' concurrent operations as fdb-etcd does. " +
			"A ratio against them is the share of FoundationDB's ceiling on this host that fdb-etcd reaches.",
		Subjects:   []string{servers.FDBEtcdFDB, servers.FDBEtcdFDB3},
		References: []string{servers.Etcd, servers.FDBRaw, servers.FDBRawBatched},
	}
}
