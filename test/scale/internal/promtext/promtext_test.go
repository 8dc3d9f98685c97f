package promtext

import (
	"math"
	"os"
	"testing"
)

// testdata/apiserver.txt is part of a real kube-apiserver 1.37 exposition
// (every ConfigMap series of apiserver_request_duration_seconds, every
// apiserver_watch_cache_consistent_read_total series); the expected sums
// below were added up from it with awk.
func TestExtractRealExposition(t *testing.T) {
	f, err := os.Open("testdata/apiserver.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fams, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	mutating := func(l Labels) bool {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY":
			return true
		}
		return false
	}
	pt, err := Extract(fams, []View{
		{Key: "mutating", Metric: "apiserver_request_duration_seconds", Match: mutating},
		{Key: "post", Metric: "apiserver_request_duration_seconds", Match: func(l Labels) bool { return l["verb"] == "POST" }},
		{Key: "absent", Metric: "apiserver_no_such_metric_seconds"},
		{Key: "reads", Metric: "apiserver_watch_cache_consistent_read_total", Kind: Counter},
		{Key: "fallbacks", Metric: "apiserver_watch_cache_consistent_read_total", Kind: Counter, Match: func(l Labels) bool { return l["fallback"] != "false" }},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := pt.Hists["mutating"]
	if m.Count != 497 || math.Abs(m.Sum-10.261710959) > 1e-6 || len(m.Bounds) != 23 {
		t.Errorf("mutating: count %v sum %v, %d bounds; want 497, 10.261710959, 23", m.Count, m.Sum, len(m.Bounds))
	}
	// POST: 355 requests, 350 within 0.1 s, all within 0.2 s: the 351.45th
	// lies 1.45/5 into (0.1, 0.2], as histogram_quantile interpolates.
	if got, want := pt.Hists["post"].Quantile(0.99), 0.1+0.1*1.45/5; math.Abs(got-want) > 1e-9 {
		t.Errorf("POST p99 = %v, want %v", got, want)
	}
	if h := pt.Hists["absent"]; h.Count != 0 || !math.IsNaN(h.Quantile(0.99)) {
		t.Errorf("absent metric: %+v, p99 %v; want empty and NaN", h, h.Quantile(0.99))
	}
	if pt.Counters["reads"] != 260 || pt.Counters["fallbacks"] != 0 {
		t.Errorf("reads %v fallbacks %v, want 260 and 0", pt.Counters["reads"], pt.Counters["fallbacks"])
	}
}

func TestQuantile(t *testing.T) {
	h := Hist{Bounds: []float64{0.005, 0.025, 0.05, 0.1}, Counts: []float64{50, 90, 99, 100}, Count: 100, Sum: 1}
	for _, c := range []struct{ q, want float64 }{
		{0.5, 0.005},                     // the first bucket, from 0
		{0.95, 0.025 + 0.025*5.0/9.0},    // 5 of the 9 in (0.025, 0.05]
		{0.99, 0.05},                     // the last of that bucket
		{0.999, 0.05 + 0.05*(99.9-99)/1}, // inside the last finite bucket
	} {
		if got := h.Quantile(c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	// Samples above the last finite bound: the highest bound, as PromQL.
	h.Count = 110
	if got := h.Quantile(0.99); got != 0.1 {
		t.Errorf("rank in +Inf: %v, want 0.1", got)
	}
}

func TestSub(t *testing.T) {
	later := Hist{Bounds: []float64{1, 2}, Counts: []float64{10, 30}, Count: 31, Sum: 40}
	earlier := Hist{Bounds: []float64{1, 2}, Counts: []float64{5, 20}, Count: 20, Sum: 25}
	d := later.Sub(earlier)
	if d.Counts[0] != 5 || d.Counts[1] != 10 || d.Count != 11 || d.Sum != 15 {
		t.Errorf("Sub = %+v", d)
	}
	// A histogram that appeared during the window: all of it counts.
	if d := later.Sub(Hist{}); d.Count != 31 {
		t.Errorf("Sub(empty) = %+v", d)
	}
	if d := (Hist{}).Sub(earlier); d.Count != 0 || !math.IsNaN(d.Mean()) {
		t.Errorf("empty.Sub = %+v", d)
	}
}
