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
