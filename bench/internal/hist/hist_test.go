package hist

import (
	"math"
	"testing"
	"time"
)

func TestBuckets(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 123456789, 1 << 40, math.MaxUint64 >> 1} {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%d)=%d out of range", v, i)
		}
		r := valueOf(i)
		diff := math.Abs(float64(r)-float64(v)) / math.Max(1, float64(v))
		if diff > 0.02 {
			t.Fatalf("value %d -> bucket %d -> %d (%.3f off)", v, i, r, diff)
		}
	}
}

func TestQuantiles(t *testing.T) {
	h := New()
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	check := func(q float64, want time.Duration) {
		got := h.Quantile(q)
		if math.Abs(float64(got-want)) > 0.02*float64(want) {
			t.Errorf("q%.2f = %v, want ~%v", q, got, want)
		}
	}
	check(0.5, 500*time.Microsecond)
	check(0.99, 990*time.Microsecond)
	check(1, 1000*time.Microsecond)
	if h.Max() != time.Millisecond || h.Min() != time.Microsecond || h.Count() != 1000 {
		t.Fatalf("max=%v min=%v n=%d", h.Max(), h.Min(), h.Count())
	}
	if New().Quantile(0.5) != 0 {
		t.Fatal("empty histogram quantile should be 0")
	}
}
