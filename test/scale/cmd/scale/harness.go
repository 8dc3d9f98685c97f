package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/cluster"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/proc"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/profile"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/promtext"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/report"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/sli"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/stores"
)

// harness runs the profile on every store and writes the outputs.
type harness struct {
	o          options
	w          io.Writer
	kwokConfig []byte
	views      []promtext.View
	header     string
}

func newHarness(o options, w io.Writer) (*harness, error) {
	kc, err := cluster.KwokConfig(o.kwokModDir, o.nodeStatus)
	if err != nil {
		return nil, err
	}
	if err := prepareOut(o.out); err != nil {
		return nil, err
	}
	h := &harness{o: o, w: w, kwokConfig: kc, views: sli.Views()}
	h.header = describe(o)
	return h, nil
}

// prepareOut empties the output directory of a previous run's files.
func prepareOut(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"report.md", "p99.png", "results.json"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	for _, k := range stores.Kinds {
		if err := os.RemoveAll(filepath.Join(dir, k)); err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.w, "%s scale: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// runAll runs every store, then writes the report; 1 if a store's run
// failed.
func (h *harness) runAll(ctx context.Context) int {
	fmt.Fprint(h.w, h.header)
	var results []report.Result
	code := 0
	for _, kind := range h.o.stores {
		if ctx.Err() != nil {
			break
		}
		r := h.runStore(ctx, kind)
		if r.Err != "" {
			h.logf("%s: FAILED: %s", stores.Title(kind), r.Err)
			code = 1
		}
		results = append(results, r)
	}
	if err := h.write(results); err != nil {
		h.logf("writing the report: %v", err)
		code = 1
	}
	if ctx.Err() != nil {
		code = 1
	}
	return code
}

// runStore starts the store and the cluster on it, runs the profile and
// samples the metrics; what went wrong ends up in Result.Err.
func (h *harness) runStore(ctx context.Context, kind string) report.Result {
	res := report.Result{Kind: kind, Title: stores.Title(kind)}
	dir := filepath.Join(h.o.out, kind)
	// What an earlier store's run left in this process (goroutines that did
	// not stop, a heap that did not shrink) would load the later stores'.
	// A collection first, so that the heap is what is still referenced.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.logf("%s: starting (harness: %d goroutines, %d MiB heap in use)", res.Title, runtime.NumGoroutine(), ms.HeapInuse>>20)
	start := time.Now()
	// A component that dies ends the run at once, with its log as the cause.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st, err := stores.Start(ctx, kind, h.o.bins, stores.Options{
		Dir: dir, ClusterFile: h.o.clusterFile, ProgressNotify: 5 * time.Second, ReadyTimeout: h.o.readyTimeout,
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer func() {
		if err := st.Stop(); err != nil {
			h.logf("%s: %v", res.Title, err)
		}
		if !h.o.keepData {
			_ = os.RemoveAll(filepath.Join(dir, "data"))
		}
	}()
	cl, err := cluster.Start(ctx, cluster.Options{
		Dir: dir, KubeBinDir: h.o.kubeBinDir, KwokBin: h.o.kwokBin, KwokConfig: h.kwokConfig,
		EtcdServers: st.ClientURLs, NodeLeaseSeconds: int(4 * h.o.leaseRenew / time.Second),
		ClientQPS: h.o.clientQPS, ReadyTimeout: h.o.readyTimeout,
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer cl.Stop()
	procs := append([]*proc.Proc{cl.Apiserver}, cl.Others...)
	proc.CancelOnExit(ctx, cancel, append(procs, st.Procs...)...)
	// Before the components are stopped: their ends are not failures.
	defer cancel(nil)
	if err := h.profile(ctx, &res, st, cl, start); err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
			err = cause
		}
		res.Err = err.Error()
	}
	res.ApiserverTooLarge = countInFile(cl.Apiserver.LogPath, "Too large resource version")
	return res
}

// profile runs set-up and the measured phase and fills res.
func (h *harness) profile(ctx context.Context, res *report.Result, st *stores.Store, cl *cluster.Cluster, start time.Time) error {
	run, err := profile.New(h.o.profile, cl.Config, func(f string, a ...any) { h.logf(res.Title+": "+f, a...) }, time.Now)
	if err != nil {
		return err
	}
	defer run.Close()
	if err := run.Setup(ctx); err != nil {
		return h.alive(st, cl, err)
	}
	if err := run.StartInformers(ctx); err != nil {
		return h.alive(st, cl, err)
	}
	res.Setup = time.Since(start)
	h.logf("%s: set up in %v; measured phase of %v begins", res.Title, res.Setup.Round(time.Second), h.o.profile.Duration)
	s := &sampler{h: h, st: st, cl: cl, run: run}
	if s.cs, err = kubernetes.NewForConfig(cl.Config(10)); err != nil {
		return err
	}
	if err := s.phase(ctx, res, filepath.Join(h.o.out, st.Kind)); err != nil {
		return h.alive(st, cl, err)
	}
	if d, ok := run.WaitBulk(5 * time.Minute); ok {
		res.BulkTook = d
	}
	final := s.usage()
	res.Final.Store, res.Final.Backing, res.Final.Apiserver = final.Store, final.Backing, final.Apiserver
	h.logf("%s: %s", res.Title, oneLine(*res))
	return h.alive(st, cl, nil)
}

// alive adds to err which process died, if one did.
func (h *harness) alive(st *stores.Store, cl *cluster.Cluster, err error) error {
	return errors.Join(err, st.Alive(), cl.Alive())
}

func countInFile(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte(s))
}

// oneLine is the stdout summary of one store's run.
func oneLine(r report.Result) string {
	w := r.Phase()
	f := func(v float64) string { return report.Format(v, report.Seconds) }
	return fmt.Sprintf("p99 mutating %s, GET %s, LIST ns %s, LIST cluster %s, informer %s; fallbacks %.0f; churned %d (%d skipped); store CPU %.0f s, peak RSS %d MiB",
		f(w.P99(sli.MutatingAll)), f(w.P99(sli.Get)), f(w.P99(sli.ListNamespace)), f(w.P99(sli.ListCluster)), f(w.ProbeP99()),
		w.Counter(sli.Fallbacks), r.Summary.Churned, r.Summary.ChurnSkipped,
		(w.To.Store.CPU - w.From.Store.CPU).Seconds(), r.Final.Store.PeakRSS>>20)
}

// describe says what this run is: the profile, the binaries' versions and
// the machine.
func describe(o options) string {
	p := o.profile
	var b strings.Builder
	fmt.Fprintf(&b, "scale: profile (-preset %s): %d nodes (lease renewed every %v, status every %v), %d pods in Deployments of %d over %d namespaces,\n",
		o.preset, p.Nodes, o.leaseRenew, o.nodeStatus, p.Pods, p.PodsPerDeployment, p.Namespaces)
	m := profile.InformerMix(p.Informers)
	fmt.Fprintf(&b, "scale:   churn %.1f pods/s for %v; %d informers (%d pods by node, %d all pods, %d endpointslices, %d configmaps);\n",
		p.ChurnRate, p.Duration, p.Informers, m.PodsByNode, m.PodsAll, m.EndpointSlices, m.ConfigMaps)
	fmt.Fprintf(&b, "scale:   full pod LISTs every %v (unpaginated and pages of %d); %.1f reads/s; %.1f probes/s; namespace of %d objects deleted at %.0f%% of the phase\n",
		p.ListInterval, p.ListPageSize, p.ReadRate, p.ProbeRate, p.BulkObjects, 100*p.BulkDeleteAt)
	fmt.Fprintf(&b, "scale: stores: %s\n", strings.Join(o.stores, ", "))
	for _, v := range versions(o) {
		fmt.Fprintf(&b, "scale:   %s\n", v)
	}
	fmt.Fprintf(&b, "scale: machine: %s\n", machine())
	fmt.Fprintf(&b, "scale: output in %s\n", o.out)
	return b.String()
}

// versions asks each binary for its version.
func versions(o options) []string {
	ask := func(name, bin string, args ...string) string {
		if bin == "" {
			return name + ": not used"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := execOutput(ctx, bin, args...)
		if err != nil {
			return fmt.Sprintf("%s: %s (%v)", name, bin, err)
		}
		return fmt.Sprintf("%s: %s", name, strings.Join(strings.Fields(firstLine(out)), " "))
	}
	return []string{
		ask("kube-apiserver", filepath.Join(o.kubeBinDir, "kube-apiserver"), "--version"),
		ask("kwok", o.kwokBin, "--version"),
		ask("etcd", o.bins.Etcd, "--version"),
		ask("fdb-etcd", o.bins.FDBEtcd, "--version"),
		ask("fdb-etcd -tags fdb", o.bins.FDBEtcdFDB, "--version"),
		ask("fdbserver", fdbserverPath(), "--version"),
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// machine is the CPU count and load, which decide what a run can sustain.
func machine() string {
	s := fmt.Sprintf("%d CPUs", numCPU())
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil {
		s += fmt.Sprintf(" (cgroup cpu.max %s)", strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			s += ", load average " + strings.Join(f[:3], " ")
		}
	}
	return s
}
