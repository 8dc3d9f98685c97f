package tenant

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkColdTenant creates b.N tenants and touches each once through
// the router: a TLS connection with its certificate and one Put, which
// starts the tenant's server. ns/op is the time to that first response.
// It then reports what the b.N servers cost while running (no
// connections, idle stop not yet due) and, once the idle stops have run,
// at rest. Run: go test ./tenant -run '^$' -bench ColdTenant -benchtime 1000x
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
	runtime.GC()
	base := runtime.NumGoroutine()
	b.ResetTimer()
	for i := range b.N {
		cli := e.dial(certs[i])
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			b.Fatal(err)
		}
		_ = cli.Close()
	}
	b.StopTimer()
	waitClosed(b, e, b.N)
	running := runtime.NumGoroutine()
	heapRunning, rssRunning := memory()
	e.timers.fire()
	deadline := time.Now().Add(2 * time.Minute)
	for e.router.Running() != 0 || runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			b.Fatalf("%d tenants still running, %d goroutines (base %d)", e.router.Running(), runtime.NumGoroutine(), base)
		}
		e.timers.fire()
		time.Sleep(10 * time.Millisecond)
	}
	heapRest, rssRest := memory()
	b.ReportMetric(float64(running-base)/float64(b.N), "goroutines/running-tenant")
	b.ReportMetric(float64(heapRunning)/float64(b.N), "heap-bytes/running-tenant")
	b.ReportMetric(float64(runtime.NumGoroutine()-base), "goroutines-at-rest")
	b.ReportMetric(float64(heapRest), "heap-bytes-at-rest")
	b.ReportMetric(float64(rssRunning)/(1<<20), "rss-MiB-running")
	b.ReportMetric(float64(rssRest)/(1<<20), "rss-MiB-at-rest")
}

// waitClosed waits until the router has counted every client's connection
// closed (each tenant's idle stop is then pending).
func waitClosed(b *testing.B, e *env, n int) {
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
