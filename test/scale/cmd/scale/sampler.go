package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
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

// sampler scrapes the apiserver and reads the processes' usage during the
// measured phase.
type sampler struct {
	h     *harness
	st    *stores.Store
	cl    *cluster.Cluster
	run   *profile.Run
	cs    kubernetes.Interface
	start time.Time
}

// phase runs the profile's measured phase, sampling at its start, every
// scrape interval and at its end, and captures the store's CPU profile in
// the middle; the samples and the summary go into res.
func (s *sampler) phase(ctx context.Context, res *report.Result, dir string) error {
	s.start = time.Now()
	first, err := s.take(ctx)
	if err != nil {
		return fmt.Errorf("first sample: %w", err)
	}
	res.Samples = append(res.Samples, first)
	var wg sync.WaitGroup
	defer wg.Wait()
	// The profiles end with the phase, even one cut short.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if d := s.h.o.cpuProfile; d > 0 && d < s.h.o.profile.Duration {
		wg.Go(func() { s.storeProfiles(pctx, s.h.o.profile.Duration/2-d/2, d, dir) })
	}
	done := make(chan profile.Summary, 1)
	wg.Go(func() { done <- s.run.Drive(ctx) })
	tick := time.NewTicker(s.h.o.scrape)
	defer tick.Stop()
	for {
		select {
		case sum := <-done:
			res.Summary = sum
			last, err := s.take(ctx)
			if err != nil {
				return fmt.Errorf("last sample: %w", err)
			}
			res.Samples = append(res.Samples, last)
			res.Start, res.End = 0, len(res.Samples)-1
			s.saveMetrics(ctx, dir)
			return nil
		case <-tick.C:
			smp, err := s.take(ctx)
			if err != nil {
				s.h.logf("%s: sample skipped: %v", s.st.Kind, err)
				continue
			}
			res.Samples = append(res.Samples, smp)
		}
	}
}

// take scrapes /metrics (three tries: an overloaded apiserver may time
// out) and reads the processes' usage.
func (s *sampler) take(ctx context.Context) (sli.Sample, error) {
	var err error
	for try := 0; try < 3; try++ {
		var pt promtext.Point
		if pt, err = s.scrape(ctx); err == nil {
			smp := s.usage()
			smp.Metrics = pt
			lat := s.run.Latencies()
			smp.Probe, smp.PodDelete = lat.Probe, lat.PodDelete
			return smp, nil
		}
	}
	return sli.Sample{}, err
}

func (s *sampler) scrape(ctx context.Context) (promtext.Point, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := s.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return promtext.Point{}, err
	}
	fams, err := promtext.Parse(bytes.NewReader(b))
	if err != nil {
		return promtext.Point{}, err
	}
	return promtext.Extract(fams, s.h.views)
}

// usage reads every role's processes; At is set from the phase's start.
func (s *sampler) usage() sli.Sample {
	smp := sli.Sample{At: time.Since(s.start)}
	read := func(pids []int) sli.Usage {
		var u sli.Usage
		for _, pid := range pids {
			if pu, err := proc.ReadUsage(pid); err == nil {
				u = u.Add(pu)
			}
		}
		return u
	}
	smp.Store = read(s.st.PIDs())
	smp.Backing = read(s.st.Backing)
	smp.Apiserver = read([]int{s.cl.Apiserver.PID()})
	smp.Others = read(proc.PIDs(s.cl.Others))
	smp.Harness = read([]int{os.Getpid()})
	return smp
}

// storeProfiles saves a CPU profile of d, starting after the given time,
// from every store process at once (etcd and fdb-etcd both serve
// /debug/pprof on the client port with --enable-pprof): a follower's CPU
// is not the owner's. Then, from the first process, its goroutines'
// stacks twice a second apart: where requests wait, which a CPU profile
// misses.
func (s *sampler) storeProfiles(ctx context.Context, after, d time.Duration, dir string) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	var wg sync.WaitGroup
	for i, u := range s.st.ClientURLs {
		wg.Go(func() {
			s.fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", u, int(d.Seconds())), d+time.Minute,
				filepath.Join(dir, fmt.Sprintf("store-cpu-%d.pprof", i)))
		})
	}
	wg.Wait()
	base := s.st.ClientURLs[0] + "/debug/pprof/"
	for i := range 2 {
		if i > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		s.fetch(ctx, base+"goroutine?debug=1", time.Minute, filepath.Join(dir, fmt.Sprintf("store-goroutines-%d.txt", i)))
	}
}

// fetch saves what url answers to path; a failure is logged, not fatal.
func (s *sampler) fetch(ctx context.Context, url string, timeout time.Duration, path string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		s.h.logf("%s: %s: %v", s.st.Kind, url, err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode == http.StatusOK {
		err = os.WriteFile(path, b, 0o644)
	} else if err == nil {
		err = fmt.Errorf("%s", resp.Status)
	}
	if err != nil {
		s.h.logf("%s: %s: %v", s.st.Kind, url, err)
	}
}

// saveMetrics keeps the apiserver's and every store process's last
// exposition for a closer look.
func (s *sampler) saveMetrics(ctx context.Context, dir string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if b, err := s.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "apiserver-metrics.txt"), b, 0o644)
	}
	for i, u := range s.st.MetricsURLs {
		s.fetch(ctx, u, 30*time.Second, filepath.Join(dir, fmt.Sprintf("store-metrics-%d.txt", i)))
	}
}

func execOutput(ctx context.Context, bin string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// fdbserverPath is fdbserver on PATH, or "" (then the fdb store is not
// in the run, or the version line says why).
func fdbserverPath() string {
	p, err := exec.LookPath("fdbserver")
	if err != nil {
		return ""
	}
	return p
}

func numCPU() int { return runtime.NumCPU() }
