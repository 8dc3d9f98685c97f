// Package latency records durations measured by the harness itself (from an
// object's creation to its delivery to an informer) in a histogram of fixed
// size, so a run of any length holds the same memory.
package latency

import (
	"math"
	"sync"
	"time"
)

// subBuckets per power of two: a quantile is exact to within 2^(1/16), ~4.4 %.
const subBuckets = 16

// maxExp bounds the range: 1 µs · 2^maxExp ≈ 18 min; longer is clamped.
const maxExp = 30

const nBuckets = maxExp*subBuckets + 1

// Histogram is safe for concurrent use.
type Histogram struct {
	mu     sync.Mutex
	counts [nBuckets]uint64 // guarded by mu
	n      uint64           // guarded by mu
	sum    time.Duration    // guarded by mu
	max    time.Duration    // guarded by mu
}

// bucketOf is the index whose range holds d: bucket 0 is below 1 µs, bucket
// i > 0 is [1 µs·2^((i-1)/16), 1 µs·2^(i/16)).
func bucketOf(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	i := int(math.Floor(math.Log2(us)*subBuckets)) + 1
	return min(i, nBuckets-1)
}

// upper is the upper bound of bucket i.
func upper(i int) time.Duration {
	return time.Duration(math.Exp2(float64(i)/subBuckets) * float64(time.Microsecond))
}

// Record adds one sample; a negative one (clock adjustments) counts as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[bucketOf(d)]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

// Snapshot is a copy of a histogram at one moment.
type Snapshot struct {
	counts [nBuckets]uint64
	N      uint64
	Sum    time.Duration
	Max    time.Duration
}

// Snapshot copies the histogram.
func (h *Histogram) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Snapshot{counts: h.counts, N: h.n, Sum: h.sum, Max: h.max}
}

// Sub returns the samples recorded after earlier (Max is s's overall max).
func (s Snapshot) Sub(earlier Snapshot) Snapshot {
	out := s
	for i := range out.counts {
		out.counts[i] -= earlier.counts[i]
	}
	out.N -= earlier.N
	out.Sum -= earlier.Sum
	return out
}

// Quantile returns the upper bound of the bucket holding the q-th sample
// (0 < q <= 1), never more than the largest sample, and the largest sample
// when it is in the last, open-ended bucket; 0 without samples.
func (s Snapshot) Quantile(q float64) time.Duration {
	if s.N == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(s.N)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range s.counts {
		seen += c
		if seen >= rank {
			if i == nBuckets-1 {
				return s.Max
			}
			return min(upper(i), s.Max)
		}
	}
	return s.Max
}

// Mean is the average sample, 0 without samples.
func (s Snapshot) Mean() time.Duration {
	if s.N == 0 {
		return 0
	}
	return s.Sum / time.Duration(s.N)
}
