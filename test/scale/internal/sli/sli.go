// Package sli defines what a scale run measures from kube-apiserver's own
// metrics (the views), the samples taken during a run, and the SLIs computed
// from them over a window, the way Kubernetes' scalability SLOs define them:
// mutating calls per verb, GET, and LIST by scope, from
// apiserver_request_duration_seconds; watch dispatch and cache freshness
// from the watch cache's metrics; the apiserver's storage calls.
package sli

import (
	"math"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/latency"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/proc"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/promtext"
)

// MutatingVerbs are the verbs of Kubernetes' mutating-call SLO (single
// objects: DELETECOLLECTION is not one).
var MutatingVerbs = []string{"POST", "PUT", "PATCH", "DELETE", "APPLY"}

// StorageOps are the apiserver's storage calls (etcd_request_duration_seconds):
// listStream is a LIST over etcd 3.7's RangeStream, getCurrentResourceVersion
// the revision check before a consistent read from the watch cache,
// listWithCount and listOnlyKeys the periodic object count and size
// estimate (not on a request's path).
var StorageOps = []string{"create", "update", "delete", "get", "list", "listStream", "getCurrentResourceVersion", "listWithCount", "listOnlyKeys"}

// View keys.
const (
	MutatingAll   = "mutating"
	Get           = "get"
	ListNamespace = "list namespace"
	ListCluster   = "list cluster"
	WatchDispatch = "watch dispatch"
	CacheReadWait = "cache read wait"
	// ConsistentReads counts consistent reads served through the watch
	// cache; Fallbacks those that were not fresh in time (fallback "true",
	// or "skipped" with ConsistentListFromCacheSkipTimeoutFallback).
	ConsistentReads = "consistent reads"
	Fallbacks       = "fallbacks"
	FailedReads     = "consistent reads failed"
)

// MutatingKey is the view key of one mutating verb.
func MutatingKey(verb string) string { return "mutating " + verb }

// StorageKey is the view key of one storage call.
func StorageKey(op string) string { return "storage " + op }

func isMutating(verb string) bool {
	for _, v := range MutatingVerbs {
		if v == verb {
			return true
		}
	}
	return false
}

const requestDuration = "apiserver_request_duration_seconds"

// notDryRun: a dry-run request never reaches storage.
func notDryRun(l promtext.Labels) bool { return l["dry_run"] == "" }

// Views are what every scrape extracts.
func Views() []promtext.View {
	vs := []promtext.View{
		{Key: MutatingAll, Metric: requestDuration, Match: func(l promtext.Labels) bool { return isMutating(l["verb"]) && notDryRun(l) }},
		{Key: Get, Metric: requestDuration, Match: func(l promtext.Labels) bool { return l["verb"] == "GET" && l["scope"] == "resource" }},
		{Key: ListNamespace, Metric: requestDuration, Match: func(l promtext.Labels) bool { return l["verb"] == "LIST" && l["scope"] == "namespace" }},
		{Key: ListCluster, Metric: requestDuration, Match: func(l promtext.Labels) bool { return l["verb"] == "LIST" && l["scope"] == "cluster" }},
		{Key: WatchDispatch, Metric: "apiserver_watch_events_dispatch_duration_seconds", Match: func(l promtext.Labels) bool { return l["stage"] == "total" }},
		{Key: CacheReadWait, Metric: "apiserver_watch_cache_read_wait_seconds"},
		{Key: ConsistentReads, Metric: "apiserver_watch_cache_consistent_read_total", Kind: promtext.Counter},
		{Key: Fallbacks, Metric: "apiserver_watch_cache_consistent_read_total", Kind: promtext.Counter, Match: func(l promtext.Labels) bool { return l["fallback"] != "false" }},
		{Key: FailedReads, Metric: "apiserver_watch_cache_consistent_read_total", Kind: promtext.Counter, Match: func(l promtext.Labels) bool { return l["success"] != "true" }},
	}
	for _, v := range MutatingVerbs {
		vs = append(vs, promtext.View{Key: MutatingKey(v), Metric: requestDuration, Match: func(l promtext.Labels) bool { return l["verb"] == v && notDryRun(l) }})
	}
	for _, op := range StorageOps {
		vs = append(vs, promtext.View{Key: StorageKey(op), Metric: "etcd_request_duration_seconds", Match: func(l promtext.Labels) bool { return l["operation"] == op }})
	}
	return vs
}

// Usage is the resource use of the processes of one role at one moment.
type Usage struct {
	CPU     time.Duration // summed over the processes
	RSS     int64         // summed
	PeakRSS int64         // the largest process's high-water mark
}

// Add folds one process's usage in.
func (u Usage) Add(p proc.Usage) Usage {
	return Usage{CPU: u.CPU + p.CPU, RSS: u.RSS + p.RSS, PeakRSS: max(u.PeakRSS, p.PeakRSS)}
}

// Sample is one scrape during a run.
type Sample struct {
	At        time.Duration // since the measured phase began (negative before)
	Metrics   promtext.Point
	Probe     latency.Snapshot // harness side: configmap create -> informer
	PodDelete latency.Snapshot // harness side: pod delete -> informer
	Store     Usage            // the store's own processes
	Backing   Usage            // the fdbserver under fdb-etcd, if any
	Apiserver Usage
	// Others are kube-controller-manager, kube-scheduler and kwok; Harness
	// is this process (the load and the informers). Both load the machine
	// every store shares, so a store measured after another can be compared
	// with what ran beside it.
	Others  Usage
	Harness Usage
}

// Window is the change between two samples.
type Window struct {
	From, To Sample
}

// Seconds is the window's length.
func (w Window) Seconds() float64 { return (w.To.At - w.From.At).Seconds() }

// Hist is one view's histogram over the window.
func (w Window) Hist(key string) promtext.Hist {
	return w.To.Metrics.Hists[key].Sub(w.From.Metrics.Hists[key])
}

// Counter is one counter view's increase over the window.
func (w Window) Counter(key string) float64 {
	return w.To.Metrics.Counters[key] - w.From.Metrics.Counters[key]
}

// P99 of a histogram view in seconds (NaN without requests).
func (w Window) P99(key string) float64 { return w.Hist(key).Quantile(0.99) }

// ProbeP99 is the harness's create-to-informer p99 in seconds.
func (w Window) ProbeP99() float64 { return seconds(w.To.Probe.Sub(w.From.Probe), 0.99) }

// PodDeleteP99 is the harness's delete-to-informer p99 in seconds.
func (w Window) PodDeleteP99() float64 { return seconds(w.To.PodDelete.Sub(w.From.PodDelete), 0.99) }

func seconds(s latency.Snapshot, q float64) float64 {
	if s.N == 0 {
		return math.NaN()
	}
	return s.Quantile(q).Seconds()
}

// StoreCores is the store's CPU use over the window in cores.
func (w Window) StoreCores() float64 {
	return (w.To.Store.CPU - w.From.Store.CPU).Seconds() / w.Seconds()
}

// Sliding returns, for each sample from the second on, the window that ends
// there and reaches back at least width (or to the first sample).
func Sliding(samples []Sample, width time.Duration) []Window {
	var out []Window
	for i := 1; i < len(samples); i++ {
		j := i - 1
		for j > 0 && samples[i].At-samples[j].At < width {
			j--
		}
		out = append(out, Window{From: samples[j], To: samples[i]})
	}
	return out
}
