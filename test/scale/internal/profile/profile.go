// Package profile is the workload of a scale run, driven through client-go
// against a running cluster: simulated nodes (kwok renews their leases and
// heart-beats their status), pods created by Deployments and ReplicaSets and
// churned by deleting them, informers on pods, endpointslices and
// configmaps, periodic full LISTs of pods, reads, and one namespace with
// many objects deleted. It measures on its own side the time from an
// object's creation or deletion to its delivery to an informer.
package profile

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/latency"
)

// Config sizes the profile.
type Config struct {
	Nodes             int
	Pods              int
	PodsPerDeployment int
	Namespaces        int           // namespaces the Deployments are spread over
	ChurnRate         float64       // pods deleted (and so recreated) per second
	Duration          time.Duration // of the measured phase
	Informers         int
	ListInterval      time.Duration // between full LISTs of pods (one unpaginated, one paginated)
	ListPageSize      int64
	ReadRate          float64 // GETs and namespace LISTs per second
	ProbeRate         float64 // configmaps created per second to time informer delivery
	BulkObjects       int     // objects in the namespace that is deleted
	BulkDeleteAt      float64 // when in the measured phase it is deleted (fraction)
	SetupTimeout      time.Duration
	Seed              int64
}

// Logf is where the profile reports progress.
type Logf func(format string, args ...any)

// Clients makes the profile's API clients: config(qps) is a fresh
// configuration for the cluster's administrator.
type Clients func(qps int) *rest.Config

// Run is one execution of the profile against one cluster.
type Run struct {
	cfg     Config
	clients Clients
	cs      kubernetes.Interface
	logf    Logf
	now     func() time.Time
	nodes   []string

	// allPods is the harness's own cluster-wide pod informer: it tells when
	// the pods are running and which pods the churn may delete.
	allPods cache.SharedIndexInformer
	// life ends (Close) the informers and the bulk deletion; wg is them.
	life context.Context
	end  context.CancelFunc
	wg   sync.WaitGroup

	bulkDone chan time.Duration // how long the bulk namespace took to go, once

	probeLat     latency.Histogram // configmap create call -> informer Add
	podDeleteLat latency.Histogram // pod delete call -> its node's informer
	fullList     latency.Histogram // unpaginated cluster-wide LIST of pods
	pagedList    latency.Histogram // paginated one, all pages

	pendingMu sync.Mutex
	pending   map[types.UID]time.Time // guarded by pendingMu: pods deleted by the churn, when

	errs errorCounts
	c    counters
}

// counters are what the drive loops did.
type counters struct {
	churned, churnSkipped, probes, probesSkipped, reads, readsSkipped atomic.Int64
	fullLists, pages, notReady, informerEvents                        atomic.Int64
}

// errorCounts counts failed requests and informer watch errors, and keeps
// the first few messages.
type errorCounts struct {
	requests, watch, tooLargeRV atomic.Int64
	mu                          sync.Mutex
	first                       []string // guarded by mu
}

const keepErrors = 10

func (e *errorCounts) add(what string, err error, watch bool) {
	if watch {
		e.watch.Add(1)
	} else {
		e.requests.Add(1)
	}
	if strings.Contains(err.Error(), "Too large resource version") {
		e.tooLargeRV.Add(1)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.first) < keepErrors {
		e.first = append(e.first, what+": "+err.Error())
	}
}

// New prepares a run; clock is the time source for every measurement.
func New(cfg Config, clients Clients, logf Logf, clock func() time.Time) (*Run, error) {
	cs, err := kubernetes.NewForConfig(clients(500))
	if err != nil {
		return nil, err
	}
	r := &Run{cfg: cfg, clients: clients, cs: cs, logf: logf, now: clock, pending: map[types.UID]time.Time{}}
	r.life, r.end = context.WithCancel(context.Background())
	for i := range cfg.Nodes {
		r.nodes = append(r.nodes, fmt.Sprintf("scale-node-%d", i))
	}
	return r, nil
}

// Close stops every informer the run started and waits for them.
func (r *Run) Close() {
	r.end()
	r.wg.Wait()
}

// Latencies are the harness-side measurements so far.
type Latencies struct {
	Probe, PodDelete, FullList, PagedList latency.Snapshot
}

// Latencies snapshots the harness-side histograms.
func (r *Run) Latencies() Latencies {
	return Latencies{r.probeLat.Snapshot(), r.podDeleteLat.Snapshot(), r.fullList.Snapshot(), r.pagedList.Snapshot()}
}

// Summary is what the measured phase did.
type Summary struct {
	Churned, ChurnSkipped    int64
	Probes, ProbesSkipped    int64
	Reads, ReadsSkipped      int64
	FullLists, Pages         int64
	InformerEvents           int64
	NodeNotReady             int64 // Ready -> not Ready transitions seen
	RequestErrors            int64
	WatchErrors              int64
	TooLargeRV               int64
	FirstErrors              []string
	BulkDeleted              bool
	BulkDeleteTook           time.Duration
	PodsRunning, PodsDesired int
	FullList, PagedList      latency.Snapshot // harness-timed full pod LISTs
}

func (r *Run) summary() Summary {
	r.errs.mu.Lock()
	first := append([]string(nil), r.errs.first...)
	r.errs.mu.Unlock()
	return Summary{
		Churned: r.c.churned.Load(), ChurnSkipped: r.c.churnSkipped.Load(),
		Probes: r.c.probes.Load(), ProbesSkipped: r.c.probesSkipped.Load(),
		Reads: r.c.reads.Load(), ReadsSkipped: r.c.readsSkipped.Load(),
		FullLists: r.c.fullLists.Load(), Pages: r.c.pages.Load(),
		InformerEvents: r.c.informerEvents.Load(), NodeNotReady: r.c.notReady.Load(),
		RequestErrors: r.errs.requests.Load(), WatchErrors: r.errs.watch.Load(),
		TooLargeRV: r.errs.tooLargeRV.Load(), FirstErrors: first,
		PodsRunning: r.runningPods(), PodsDesired: r.cfg.Pods,
		FullList: r.fullList.Snapshot(), PagedList: r.pagedList.Snapshot(),
	}
}

// runningPods counts pods that are Running and not being deleted.
func (r *Run) runningPods() int {
	n := 0
	for _, o := range r.allPods.GetStore().List() {
		if p, ok := o.(*corev1.Pod); ok && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			n++
		}
	}
	return n
}

// rng is a source of randomness for one goroutine.
func (r *Run) rng(stream int64) *rand.Rand { return rand.New(rand.NewSource(r.cfg.Seed + stream)) }
