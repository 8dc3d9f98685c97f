package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

func TestRatio(t *testing.T) {
	tp := func(v float64) workload.Result { return workload.Result{Kind: workload.Throughput, Value: v} }
	tm := func(v float64) workload.Result { return workload.Result{Kind: workload.Time, Value: v} }
	if r, ok := Ratio(tp(200), tp(100)); !ok || r != 2 {
		t.Fatalf("throughput ratio = %v %v, want 2", r, ok)
	}
	if r, ok := Ratio(tm(0.5), tm(1)); !ok || r != 2 {
		t.Fatalf("time ratio = %v %v, want 2 (base twice as fast)", r, ok)
	}
	if _, ok := Ratio(tp(1), workload.Result{NA: "unsupported"}); ok {
		t.Fatal("ratio against n/a should be absent")
	}
}

func TestMarkdown(t *testing.T) {
	r := New("t", []string{"etcd", "kine", "fdb-etcd"}, "fdb-etcd")
	r.Add(workload.Result{Server: "etcd", Row: "put", Kind: workload.Throughput, Value: 1000})
	r.Add(workload.Result{Server: "kine", Row: "put", NA: "unsupported"})
	r.Add(workload.Result{Server: "fdb-etcd", Row: "put", Kind: workload.Throughput, Value: 1500})
	r.Add(workload.Result{Server: "etcd", Row: "watch", Kind: workload.Time, Value: 0.002, P99: 3 * time.Millisecond, Caveat: "50 w/s, 90% delivered"})
	var b bytes.Buffer
	r.Markdown(&b)
	out := b.String()
	for _, want := range []string{"| watch | ms ↓ | 2.00 (50 w/s, 90% delivered) | 3.00 | – | – | – | – | – | – |", "not directly comparable", "| fdb-etcd/etcd | fdb-etcd/kine |", "| put | ops/s ↑ | 1000 | – | n/a | – | 1500 | – | 1.50× | – |"} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
}

// TestComparison: the FoundationDB table puts each subject next to every
// reference with subject/reference ratios; a reference without an
// equivalent shows a dash, and rows no subject ran are left out.
func TestComparison(t *testing.T) {
	r := New("t", []string{"etcd", "fdb-etcd-fdb", "fdb-etcd-fdb3", "fdb-raw", "fdb-raw-batched"}, "fdb-etcd-fdb")
	r.Comparisons = []Comparison{{
		Title:      "FDB",
		Subjects:   []string{"fdb-etcd-fdb", "fdb-etcd-fdb3"},
		References: []string{"etcd", "kine", "fdb-raw", "fdb-raw-batched"}, // kine did not run
	}}
	tp := func(server, row string, v float64) workload.Result {
		return workload.Result{Server: server, Row: row, Kind: workload.Throughput, Value: v}
	}
	for _, res := range []workload.Result{
		tp("etcd", "put", 2000), tp("fdb-etcd-fdb", "put", 1000), tp("fdb-etcd-fdb3", "put", 500),
		tp("fdb-raw", "put", 4000), tp("fdb-raw-batched", "put", 8000),
		tp("etcd", "range", 100), tp("fdb-etcd-fdb", "range", 300),
		tp("fdb-raw", "range", 600), {Server: "fdb-raw-batched", Row: "range", NoEquivalent: "not a write"},
		{Server: "fdb-etcd-fdb", Row: "rss", Kind: workload.Bytes, Value: 1 << 20}, {Server: "fdb-raw", Row: "rss", NoEquivalent: "no watchers"},
		tp("etcd", "etcd only", 1),
	} {
		r.Add(res)
	}
	var b bytes.Buffer
	r.Markdown(&b)
	out := b.String()
	for _, want := range []string{
		"## FDB",
		"| workload | unit | etcd | fdb-raw | fdb-raw-batched | fdb-etcd-fdb | fdb-etcd-fdb/etcd | fdb-etcd-fdb/fdb-raw | fdb-etcd-fdb/fdb-raw-batched | fdb-etcd-fdb3 | fdb-etcd-fdb3/etcd | fdb-etcd-fdb3/fdb-raw | fdb-etcd-fdb3/fdb-raw-batched |",
		"| put | ops/s ↑ | 2000 | 4000 | 8000 | 1000 | 0.50× | 0.25× | 0.12× | 500 | 0.25× | 0.12× | 0.06× |",
		"| range | ops/s ↑ | 100 | 600 | – | 300 | 3.00× | 0.50× | – | – | – | – | – |",
		"| rss | MiB ↓ | – | – | – | 1.0 | – | – | – | – | – | – | – |",
		"| range | fdb-raw-batched | | | | | | no equivalent: not a write |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out[strings.Index(out, "## FDB"):strings.Index(out, "## Details")], "etcd only") {
		t.Errorf("a row no subject ran is in the comparison:\n%s", out)
	}
	// The main table shows a dash, not n/a, for a reference without an equivalent.
	if !strings.Contains(out, "| range | ops/s ↑ | 100 | – | 300 | – | – | – | 600 | – | – | – |") {
		t.Errorf("main table row for range:\n%s", out)
	}

	got := map[string]float64{}
	for _, e := range r.ComparisonRatios() {
		got[e.Row+" "+e.Server+"/"+e.Against] = e.Ratio
	}
	want := map[string]float64{
		"put fdb-etcd-fdb/etcd": 0.5, "put fdb-etcd-fdb/fdb-raw": 0.25, "put fdb-etcd-fdb/fdb-raw-batched": 0.125,
		"put fdb-etcd-fdb3/etcd": 0.25, "put fdb-etcd-fdb3/fdb-raw": 0.125, "put fdb-etcd-fdb3/fdb-raw-batched": 0.0625,
		"range fdb-etcd-fdb/etcd": 3, "range fdb-etcd-fdb/fdb-raw": 0.5,
	}
	if len(got) != len(want) {
		t.Errorf("ratios %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ratio %s = %v, want %v", k, got[k], v)
		}
	}
}

// TestCPUTable: closed-loop rows show their CPU per operation by process,
// and how busy the host was; rows without CPU are left out.
func TestCPUTable(t *testing.T) {
	r := New("t", []string{"etcd", "fdb-etcd-fdb"}, "")
	r.Cores = 2
	r.Add(workload.Result{Server: "etcd", Row: "put", Kind: workload.Throughput, Value: 1000, Ops: 1000, Elapsed: time.Second,
		CPU: &workload.CPU{Server: 500 * time.Millisecond, Client: 300 * time.Millisecond}})
	r.Add(workload.Result{Server: "fdb-etcd-fdb", Row: "put", Kind: workload.Throughput, Value: 100, Ops: 100, Elapsed: time.Second,
		CPU: &workload.CPU{Server: 100 * time.Millisecond, Store: 200 * time.Millisecond, Client: 50 * time.Millisecond}})
	r.Add(workload.Result{Server: "etcd", Row: "list", Kind: workload.Time, Value: 0.2})
	var b bytes.Buffer
	r.Markdown(&b)
	out := b.String()
	if want := "| put | 500 / 0 / 300, 40% | 1000 / 2000 / 500, 18% |"; !strings.Contains(out, want) {
		t.Errorf("markdown lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "| list | –") {
		t.Errorf("a row without CPU is in the CPU table:\n%s", out)
	}
}
