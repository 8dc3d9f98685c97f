// Package report turns the samples of a scale run into its outputs: the
// SLI table and the targets (markdown), the p99-over-time plot (PNG) and the
// numbers as JSON.
package report

import (
	"math"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/profile"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/sli"
)

// Result is one store's run.
type Result struct {
	Kind, Title string
	Samples     []sli.Sample
	// Start and End index Samples: the measured phase's first and last.
	Start, End int
	Summary    profile.Summary
	Setup      time.Duration // from the cluster's start to every pod running
	BulkTook   time.Duration // the bulk namespace's deletion, 0 if unfinished
	// ApiserverTooLarge counts "Too large resource version" in the
	// apiserver's log.
	ApiserverTooLarge int
	// Final is each role's usage at the end (peak RSS is over the whole run).
	Final struct{ Store, Backing, Apiserver sli.Usage }
	Err   string // why the run stopped early, if it did
}

// Measured reports whether the run reached its measured phase.
func (r Result) Measured() bool { return r.End > r.Start && r.End < len(r.Samples) }

// Phase is the measured phase's window.
func (r Result) Phase() sli.Window { return sli.Window{From: r.Samples[r.Start], To: r.Samples[r.End]} }

// Unit says how a row's values print and compare.
type Unit int

const (
	Seconds Unit = iota // a latency
	Count
	Bytes
	CPUSeconds
	Rate // per second
)

// Row is one line of the table: a value per store kind.
type Row struct {
	Name   string
	Unit   Unit
	Values map[string]float64 // by store kind; NaN: nothing measured
	// SLO is Kubernetes' published threshold (0: none).
	SLO float64
	// Compare: the row is an SLI the targets judge (lower is better).
	Compare bool
	// Zero: the row must be 0 on every store.
	Zero bool
	// OmitEmpty: leave the row out when no store measured it.
	OmitEmpty bool
}

// flags are a row's Compare, Zero and OmitEmpty.
type flags int

const (
	compare flags = 1 << iota
	zero
	omitEmpty
)

// rowDef computes one row from a store's result.
type rowDef struct {
	name  string
	unit  Unit
	slo   float64
	flags flags
	value func(Result) float64
}

func phaseP99(key string) func(Result) float64 {
	return func(r Result) float64 { return r.Phase().P99(key) }
}

func snapshotP99(f func(sli.Window) float64) func(Result) float64 {
	return func(r Result) float64 { return f(r.Phase()) }
}

func sloRows() []rowDef {
	rows := []rowDef{{"mutating p99, all verbs", Seconds, 1, compare, phaseP99(sli.MutatingAll)}}
	for _, v := range sli.MutatingVerbs {
		rows = append(rows, rowDef{"mutating p99, " + v, Seconds, 1, compare | omitEmpty, phaseP99(sli.MutatingKey(v))})
	}
	return append(rows,
		rowDef{"GET p99 (resource)", Seconds, 1, compare, phaseP99(sli.Get)},
		rowDef{"LIST p99, namespace scope", Seconds, 5, compare, phaseP99(sli.ListNamespace)},
		rowDef{"LIST p99, cluster scope", Seconds, 30, compare, phaseP99(sli.ListCluster)},
		rowDef{"watch event dispatch p99 (apiserver, stage total)", Seconds, 0, compare, phaseP99(sli.WatchDispatch)},
		rowDef{"watch delivery p99, ConfigMap create -> informer (harness)", Seconds, 0, compare, snapshotP99(sli.Window.ProbeP99)},
		rowDef{"watch delivery p99, pod delete -> informer (harness)", Seconds, 0, compare, snapshotP99(sli.Window.PodDeleteP99)},
		rowDef{"consistent read wait for cache p99", Seconds, 0, compare, phaseP99(sli.CacheReadWait)},
	)
}

func freshnessRows() []rowDef {
	counter := func(key string) func(Result) float64 {
		return func(r Result) float64 { return r.Phase().Counter(key) }
	}
	return []rowDef{
		{"consistent reads from the watch cache", Count, 0, 0, counter(sli.ConsistentReads)},
		{"consistent-read fallbacks to storage", Count, 0, zero, counter(sli.Fallbacks)},
		{"consistent reads failed", Count, 0, zero, counter(sli.FailedReads)},
		{"Too large resource version (harness requests and informers)", Count, 0, zero, func(r Result) float64 { return float64(r.Summary.TooLargeRV) }},
		{"Too large resource version (apiserver log, whole run)", Count, 0, zero, func(r Result) float64 { return float64(r.ApiserverTooLarge) }},
	}
}

func resourceRows() []rowDef {
	phaseCPU := func(u func(sli.Sample) sli.Usage) func(Result) float64 {
		return func(r Result) float64 {
			w := r.Phase()
			return (u(w.To).CPU - u(w.From).CPU).Seconds()
		}
	}
	store := func(s sli.Sample) sli.Usage { return s.Store }
	backing := func(s sli.Sample) sli.Usage { return s.Backing }
	apiserver := func(s sli.Sample) sli.Usage { return s.Apiserver }
	others := func(s sli.Sample) sli.Usage { return s.Others }
	harness := func(s sli.Sample) sli.Usage { return s.Harness }
	return []rowDef{
		{"store CPU seconds, measured phase", CPUSeconds, 0, compare, phaseCPU(store)},
		{"store CPU seconds, whole run", CPUSeconds, 0, 0, func(r Result) float64 { return r.Final.Store.CPU.Seconds() }},
		{"store peak RSS (largest process)", Bytes, 0, compare, func(r Result) float64 { return float64(r.Final.Store.PeakRSS) }},
		{"fdbserver CPU seconds, measured phase", CPUSeconds, 0, omitEmpty, ifBacking(phaseCPU(backing))},
		{"fdbserver peak RSS", Bytes, 0, omitEmpty, ifBacking(func(r Result) float64 { return float64(r.Final.Backing.PeakRSS) })},
		{"kube-apiserver CPU seconds, measured phase", CPUSeconds, 0, 0, phaseCPU(apiserver)},
		{"kube-apiserver peak RSS", Bytes, 0, 0, func(r Result) float64 { return float64(r.Final.Apiserver.PeakRSS) }},
		{"controller-manager, scheduler and kwok CPU seconds, measured phase", CPUSeconds, 0, 0, phaseCPU(others)},
		{"harness CPU seconds, measured phase", CPUSeconds, 0, 0, phaseCPU(harness)},
		{"harness RSS at the end of the phase", Bytes, 0, 0, func(r Result) float64 { return float64(harness(r.Phase().To).RSS) }},
	}
}

// ifBacking is f for a store on an fdbserver, NaN for the others.
func ifBacking(f func(Result) float64) func(Result) float64 {
	return func(r Result) float64 {
		if r.Final.Backing.PeakRSS == 0 {
			return math.NaN()
		}
		return f(r)
	}
}

func storageRows() []rowDef {
	var rows []rowDef
	for _, op := range sli.StorageOps {
		rows = append(rows, rowDef{"storage call p99, " + op, Seconds, 0, omitEmpty, phaseP99(sli.StorageKey(op))})
	}
	return rows
}

func profileRows() []rowDef {
	per := func(f func(profile.Summary) int64) func(Result) float64 {
		return func(r Result) float64 { return float64(f(r.Summary)) / r.Phase().Seconds() }
	}
	n := func(f func(profile.Summary) int64) func(Result) float64 {
		return func(r Result) float64 { return float64(f(r.Summary)) }
	}
	return []rowDef{
		{"pods churned per second", Rate, 0, 0, per(func(s profile.Summary) int64 { return s.Churned })},
		{"churn ticks skipped (64 deletes in flight)", Count, 0, 0, n(func(s profile.Summary) int64 { return s.ChurnSkipped })},
		{"probe ConfigMaps per second", Rate, 0, 0, per(func(s profile.Summary) int64 { return s.Probes })},
		{"reads per second (GET, namespace LISTs)", Rate, 0, 0, per(func(s profile.Summary) int64 { return s.Reads })},
		{"full pod LISTs (each: one unpaginated, one paginated)", Count, 0, 0, n(func(s profile.Summary) int64 { return s.FullLists })},
		{"full pod LIST p99, unpaginated (harness)", Seconds, 0, 0, func(r Result) float64 { return quantile(r, fullList) }},
		{"full pod LIST p99, paginated, all pages (harness)", Seconds, 0, 0, func(r Result) float64 { return quantile(r, pagedList) }},
		{"informer events delivered", Count, 0, 0, n(func(s profile.Summary) int64 { return s.InformerEvents })},
		{"node Ready -> NotReady transitions", Count, 0, zero, n(func(s profile.Summary) int64 { return s.NodeNotReady })},
		{"request errors (harness)", Count, 0, 0, n(func(s profile.Summary) int64 { return s.RequestErrors })},
		{"informer watch errors", Count, 0, 0, n(func(s profile.Summary) int64 { return s.WatchErrors })},
		{"bulk namespace deletion", Seconds, 0, 0, func(r Result) float64 {
			if r.BulkTook == 0 {
				return math.NaN()
			}
			return r.BulkTook.Seconds()
		}},
		{"pods Running at the end of the phase", Count, 0, 0, n(func(s profile.Summary) int64 { return int64(s.PodsRunning) })},
	}
}

type listKind int

const (
	fullList listKind = iota
	pagedList
)

func quantile(r Result, k listKind) float64 {
	s := r.Summary.FullList
	if k == pagedList {
		s = r.Summary.PagedList
	}
	if s.N == 0 {
		return math.NaN()
	}
	return s.Quantile(0.99).Seconds()
}

// Section is a titled group of rows.
type Section struct {
	Title string
	Rows  []Row
}

// Sections computes every row for the results that reached their phase.
func Sections(results []Result) []Section {
	groups := []struct {
		title string
		defs  []rowDef
	}{
		{"Kubernetes API call latency and watch latency (SLIs)", sloRows()},
		{"Watch-cache freshness (must be 0)", freshnessRows()},
		{"Storage server resources", resourceRows()},
		{"The apiserver's storage calls (etcd_request_duration_seconds)", storageRows()},
		{"What the profile did", profileRows()},
	}
	var out []Section
	for _, g := range groups {
		s := Section{Title: g.title}
		for _, d := range g.defs {
			row := Row{Name: d.name, Unit: d.unit, SLO: d.slo, Values: map[string]float64{},
				Compare: d.flags&compare != 0, Zero: d.flags&zero != 0, OmitEmpty: d.flags&omitEmpty != 0}
			for _, r := range results {
				if r.Measured() {
					row.Values[r.Kind] = d.value(r)
				}
			}
			s.Rows = append(s.Rows, row)
		}
		out = append(out, s)
	}
	return out
}
