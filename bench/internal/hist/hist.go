// Package hist is a small lock-free latency histogram with ~1.5% relative
// precision, safe for concurrent recording from many goroutines.
package hist

import (
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits    = 6
	subCount   = 1 << subBits // 64 sub-buckets per power of two
	numBuckets = (64 - subBits) * subCount
)

// Histogram records non-negative durations.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	n      atomic.Uint64
	sum    atomic.Uint64
	max    atomic.Uint64
	min    atomic.Uint64 // stored as ^v so that the zero value means "none"
}

// New returns an empty histogram.
func New() *Histogram { return &Histogram{} }

func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1
	m := v >> uint(shift) // in [subCount, 2*subCount)
	return (shift+1)*subCount + int(m-subCount)
}

// valueOf returns a representative value (the midpoint) of bucket i.
func valueOf(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	shift := i/subCount - 1
	m := uint64(i%subCount + subCount)
	return m<<uint(shift) + (uint64(1)<<uint(shift))/2
}

// Record adds one sample.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	v := uint64(d)
	h.counts[bucketOf(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for {
		cur := h.max.Load()
		if v <= cur || h.max.CompareAndSwap(cur, v) {
			break
		}
	}
	for {
		cur := h.min.Load()
		if (cur != 0 && ^cur <= v) || h.min.CompareAndSwap(cur, ^v) {
			break
		}
	}
}

// Count is the number of samples recorded.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Max is the largest sample recorded (0 if none).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Min is the smallest sample recorded (0 if none).
func (h *Histogram) Min() time.Duration {
	m := h.min.Load()
	if m == 0 {
		return 0
	}
	return time.Duration(^m)
}

// Mean is the arithmetic mean of the samples (0 if none).
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns an approximation of the q-quantile (0 < q <= 1), clamped
// to the observed min and max. It returns 0 for an empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			v := time.Duration(valueOf(i))
			if mx := h.Max(); v > mx {
				v = mx
			}
			if mn := h.Min(); v < mn {
				v = mn
			}
			return v
		}
	}
	return h.Max()
}
