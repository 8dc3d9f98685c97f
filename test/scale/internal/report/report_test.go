package report

import (
	"bytes"
	"image/png"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/promtext"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/sli"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/stores"
)

func verdict(vs []Verdict, target string) (Verdict, bool) {
	for _, v := range vs {
		if v.Target == target {
			return v, true
		}
	}
	return Verdict{}, false
}

func TestJudge(t *testing.T) {
	row := Row{Name: "GET p99", Unit: Seconds, SLO: 1, Compare: true,
		Values: map[string]float64{stores.Etcd: 0.020, stores.Pebble: 0.021, stores.FDB: 0.029}}
	vs := judge(row)
	if v, ok := verdict(vs, "Pebble ≤ etcd"); !ok || v.Holds {
		t.Errorf("Pebble 21 ms vs etcd 20 ms: %+v", v)
	}
	if v, ok := verdict(vs, "FoundationDB ≤ SLO"); !ok || !v.Holds {
		t.Errorf("FoundationDB 29 ms vs SLO 1 s: %+v", v)
	}
	if v, ok := verdict(vs, "FoundationDB ≤ 1.5× etcd"); !ok || !v.Holds || !strings.Contains(v.Detail, "1.45×") {
		t.Errorf("FoundationDB 29 ms vs 1.5 × 20 ms: %+v", v)
	}
	row.Values[stores.FDB] = 0.031
	if v, _ := verdict(judge(row), "FoundationDB ≤ 1.5× etcd"); v.Holds {
		t.Errorf("FoundationDB 31 ms vs 1.5 × 20 ms holds: %+v", v)
	}
	// Nothing measured on a store: no verdict about it.
	row.Values[stores.Pebble] = math.NaN()
	if _, ok := verdict(judge(row), "Pebble ≤ etcd"); ok {
		t.Error("verdict on an unmeasured row")
	}
	zero := Row{Name: "fallbacks", Unit: Count, Zero: true, Values: map[string]float64{stores.Etcd: 0, stores.FDB: 2}}
	vs = judge(zero)
	if len(vs) != 2 || !vs[0].Holds || vs[1].Holds {
		t.Errorf("zero row: %+v", vs)
	}
	if vs := judge(Row{Name: "informational", Values: map[string]float64{stores.Etcd: 1, stores.Pebble: 2}}); len(vs) != 0 {
		t.Errorf("informational row judged: %+v", vs)
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		u    Unit
		want string
	}{
		{0.0042, Seconds, "4.20 ms"}, {0.1649, Seconds, "164.9 ms"}, {2.5, Seconds, "2.50 s"},
		{math.NaN(), Seconds, "–"}, {70 << 20, Bytes, "70 MiB"}, {12, Count, "12"}, {5.21, CPUSeconds, "5.2 s"},
	} {
		if got := Format(c.v, c.u); got != c.want {
			t.Errorf("Format(%v, %v) = %q, want %q", c.v, c.u, got, c.want)
		}
	}
}

// sample makes a sample whose mutating histogram has n requests, all in
// the (0.025, 0.05] bucket, and the store at cpu seconds.
func sample(at time.Duration, n float64, cpu time.Duration) sli.Sample {
	bounds := []float64{0.005, 0.025, 0.05, 0.1}
	h := promtext.Hist{Bounds: bounds, Counts: []float64{0, 0, n, n}, Count: n, Sum: 0.04 * n}
	return sli.Sample{At: at, Metrics: promtext.Point{Hists: map[string]promtext.Hist{sli.MutatingAll: h}, Counters: map[string]float64{}},
		Store: sli.Usage{CPU: cpu}}
}

func TestSectionsAndPlot(t *testing.T) {
	var rs []Result
	for i, kind := range stores.Kinds {
		r := Result{Kind: kind, Title: stores.Title(kind)}
		for s := 0; s <= 8; s++ {
			r.Samples = append(r.Samples, sample(time.Duration(s)*15*time.Second, float64(100*s), time.Duration(s*(i+1))*time.Second))
		}
		r.End = len(r.Samples) - 1
		rs = append(rs, r)
	}
	rs = append(rs, Result{Kind: "failed", Err: "did not start"})
	secs := Sections(rs)
	mut := secs[0].Rows[0]
	for _, k := range stores.Kinds {
		// 800 requests in (0.025, 0.05]: p99 is 99 % of the way through it.
		if v := mut.Values[k]; math.Abs(v-(0.025+0.025*0.99)) > 1e-9 {
			t.Errorf("%s mutating p99 = %v", k, v)
		}
	}
	if _, ok := mut.Values["failed"]; ok {
		t.Error("a failed run has values")
	}
	md := Markdown(secs, []string{stores.Etcd, stores.Pebble, stores.FDB})
	if !strings.Contains(md, "| mutating p99, all verbs | 49.8 ms | 49.8 ms | 49.8 ms | ≤ 1.00 s |") {
		t.Errorf("markdown:\n%s", md)
	}
	if strings.Contains(md, "APPLY") {
		t.Error("a verb no store saw is listed")
	}
	var png1 bytes.Buffer
	if err := Plot(&png1, rs, time.Minute); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&png1)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 700 {
		t.Errorf("plot is %v", b)
	}
}
