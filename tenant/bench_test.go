package tenant

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkColdTenant creates b.N tenants and touches each once through
// the router: a TLS connection with its certificate and one Put, which
// starts the tenant's server. ns/op is the time to that first response.
// Every coldBatch tenants it measures what their servers cost while
// running (no connections, idle stop not yet due), then runs the idle
// stops; at the end it reports the process at rest. Run: go test ./tenant -run '^$' -bench ColdTenant -benchtime 1000x
func BenchmarkColdTenant(b *testing.B) {
	e := startRouter(b, false)
	ctx := context.Background()
	names := make([]string, b.N)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%05d", i)
		if _, err := e.router.Registry().Create(ctx, names[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	certs := make([]tls.Certificate, b.N)
	for i := range certs {
		certs[i] = e.clientCert(names[i])
	}
	base := runtime.NumGoroutine()
	heapBase, _ := memory()
	var running, heapRunning, rssRunning, inBatch int
	b.ResetTimer()
	for i := range b.N {
		cli := e.dial(certs[i])
		certs[i] = tls.Certificate{} // the test's, not the tenant's memory
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			b.Fatal(err)
		}
		_ = cli.Close()
		if inBatch++; inBatch == coldBatch || i == b.N-1 {
			b.StopTimer()
			waitClosed(b, e, inBatch)
			g := runtime.NumGoroutine()
			h, r := memory()
			running, heapRunning, rssRunning = max(running, (g-base)/inBatch), max(heapRunning, int(h)/inBatch), max(rssRunning, int(r))
			stopAll(b, e, base)
			inBatch = 0
			b.StartTimer()
		}
	}
	b.StopTimer()
	heapRest, rssRest := memory()
	b.ReportMetric(float64(running), "goroutines/running-tenant")
	b.ReportMetric(float64(heapRunning), "heap-bytes/running-tenant")
	b.ReportMetric(float64(runtime.NumGoroutine()-base), "goroutines-at-rest")
	b.ReportMetric((float64(heapRest)-float64(heapBase))/float64(b.N), "heap-bytes/idle-tenant")
	b.ReportMetric(float64(rssRunning)/(1<<20), "rss-MiB-running")
	b.ReportMetric(float64(rssRest)/(1<<20), "rss-MiB-at-rest")
}

// coldBatch is how many tenants run at once before the benchmark fires
// their idle stops: a thousand running servers would measure the shared
// test machine's scheduler rather than a cold start.
const coldBatch = 100

// stopAll fires the pending idle stops and waits until no tenant runs and
// the goroutines are back to base.
func stopAll(b testing.TB, e *env, base int) {
	deadline := time.Now().Add(2 * time.Minute)
	for e.router.Running() != 0 || runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			b.Fatalf("%d tenants still running, %d goroutines (base %d)", e.router.Running(), runtime.NumGoroutine(), base)
		}
		e.timers.fire()
		time.Sleep(10 * time.Millisecond)
	}
}

// waitClosed waits until the router has counted every client's connection
// closed (each tenant's idle stop is then pending).
func waitClosed(b testing.TB, e *env, n int) {
	deadline := time.Now().Add(time.Minute)
	for {
		e.timers.mu.Lock()
		pending := len(e.timers.pending)
		e.timers.mu.Unlock()
		if pending >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d connections counted closed", pending, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// memory is the live heap after a collection and the process's RSS.
func memory() (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return ms.HeapInuse, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			rss = kb << 10
		}
	}
	return ms.HeapInuse, rss
}

// restWindow is how long BenchmarkQuietTenants measures the process at
// rest.
const restWindow = 30 * time.Second

// BenchmarkQuietTenants connects b.N tenants at once, each with one client
// that put once and then sends nothing, and measures the process at rest
// for restWindow: CPU time, goroutines, heap and RSS per connected tenant
// (these include each client's side of its connection, in this process).
// Then it closes the clients, runs the idle stops and measures the same
// at rest with every tenant idle. Run: go test ./tenant -run '^$' -bench
// QuietTenants -benchtime 1000x -timeout 30m
func BenchmarkQuietTenants(b *testing.B) {
	e := startRouter(b, false)
	ctx := context.Background()
	base := runtime.NumGoroutine()
	heapBase, rssBase := memory()
	clients := make([]*clientv3.Client, b.N)
	for i := range b.N {
		name := fmt.Sprintf("tenant-%05d", i)
		if _, err := e.router.Registry().Create(ctx, name, 0); err != nil {
			b.Fatal(err)
		}
		clients[i] = e.dial(e.clientCert(name))
		if _, err := clients[i].Put(ctx, "k", "v"); err != nil {
			b.Fatal(err)
		}
	}
	rest := restWindow
	if b.N < 10 {
		rest = time.Second // the testing package's probe run with b.N = 1, not the measurement
	}
	cpu, g := atRest(rest), runtime.NumGoroutine()
	heap, rss := memory()
	n := float64(b.N)
	b.ReportMetric(cpu.Seconds()/rest.Seconds()*100, "cpu-%-connected-at-rest")
	b.ReportMetric(float64(g-base)/n, "goroutines/connected-tenant")
	b.ReportMetric((float64(heap)-float64(heapBase))/n, "heap-bytes/connected-tenant")
	b.ReportMetric((float64(rss)-float64(rssBase))/n/1024, "rss-KiB/connected-tenant")
	for _, c := range clients {
		_ = c.Close()
	}
	clients = nil // the test's, not the tenants' memory
	waitClosed(b, e, b.N)
	stopAll(b, e, base)
	cpu, g = atRest(rest), runtime.NumGoroutine()
	heap, rss = memory()
	b.ReportMetric(cpu.Seconds()/rest.Seconds()*100, "cpu-%-idle-at-rest")
	b.ReportMetric(float64(g-base), "goroutines-idle-at-rest")
	b.ReportMetric((float64(heap)-float64(heapBase))/n, "heap-bytes/idle-tenant")
	b.ReportMetric(float64(rss)/(1<<20), "rss-MiB-idle-at-rest")
}

// atRest waits d and returns the CPU time the process used
// meanwhile (user and system, every thread: FoundationDB's network thread
// too).
func atRest(d time.Duration) time.Duration {
	runtime.GC()
	// A CPU profile of the rest alone, without the set-up around it:
	// FDB_ETCD_BENCH_REST_CPUPROFILE=prefix writes prefix.<unix time>.
	if prefix := os.Getenv("FDB_ETCD_BENCH_REST_CPUPROFILE"); prefix != "" && d >= 10*time.Second {
		if out, err := os.Create(fmt.Sprintf("%s.%d", prefix, time.Now().Unix())); err == nil {
			defer out.Close() // after StopCPUProfile's last write (defers run last first)
			if pprof.StartCPUProfile(out) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	before := cpuTime()
	time.Sleep(d)
	return cpuTime() - before
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
