package latency

import (
	"math"
	"testing"
	"time"
)

func TestQuantileWithinResolution(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	s := h.Snapshot()
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		got := s.Quantile(c.q)
		// The bucket's upper bound: never below the true value, at most
		// 2^(1/16) above it.
		if got < c.want || float64(got) > float64(c.want)*math.Exp2(1.0/subBuckets) {
			t.Errorf("q%v = %v, want %v (+%.1f%%)", c.q, got, c.want, 100*(math.Exp2(1.0/subBuckets)-1))
		}
	}
	if s.Mean() != 500500*time.Microsecond || s.Max != time.Second || s.N != 1000 {
		t.Errorf("mean %v max %v n %d", s.Mean(), s.Max, s.N)
	}
}

func TestSubAndEdges(t *testing.T) {
	var h Histogram
	if q := h.Snapshot().Quantile(0.99); q != 0 {
		t.Errorf("empty: %v", q)
	}
	h.Record(-time.Second) // a clock step back counts as 0
	h.Record(500 * time.Nanosecond)
	before := h.Snapshot()
	h.Record(time.Hour) // beyond the range: clamped into the last bucket
	d := h.Snapshot().Sub(before)
	if d.N != 1 || d.Quantile(0.5) != time.Hour || d.Sum != time.Hour {
		t.Errorf("window: n %d q50 %v sum %v", d.N, d.Quantile(0.5), d.Sum)
	}
	if q := before.Quantile(1); q != 500*time.Nanosecond {
		t.Errorf("sub-microsecond: %v", q)
	}
}
