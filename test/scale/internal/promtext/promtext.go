// Package promtext reads a Prometheus text exposition (kube-apiserver's
// /metrics) and reduces it to the few histograms and counters a scale run
// reports: a View names a metric and the series to add up, Extract applies
// views to one scrape, and a Hist's quantile is computed the way PromQL's
// histogram_quantile does, so the numbers match what an SLO dashboard shows.
package promtext

import (
	"fmt"
	"io"
	"math"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Labels are one series' label pairs.
type Labels map[string]string

// Kind says how a view's series are combined.
type Kind int

const (
	// Histogram views add up the buckets of every matching series.
	Histogram Kind = iota
	// Counter views add up the values of matching counters (or gauges).
	Counter
)

// View selects the series of one metric.
type View struct {
	Key    string // the name the result is filed under
	Metric string
	Kind   Kind
	Match  func(Labels) bool // nil: every series
}

// Hist is a cumulative histogram: Counts[i] samples were <= Bounds[i]; Count
// includes the +Inf bucket.
type Hist struct {
	Bounds []float64
	Counts []float64
	Count  float64
	Sum    float64
}

// Point is the result of every view on one scrape.
type Point struct {
	Hists    map[string]Hist
	Counters map[string]float64
}

// Parse reads one exposition.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// Extract applies the views to parsed metric families.
func Extract(fams map[string]*dto.MetricFamily, views []View) (Point, error) {
	pt := Point{Hists: map[string]Hist{}, Counters: map[string]float64{}}
	for _, v := range views {
		fam := fams[v.Metric]
		switch v.Kind {
		case Histogram:
			h, err := sumHist(fam, v.Match)
			if err != nil {
				return Point{}, fmt.Errorf("%s (%s): %w", v.Key, v.Metric, err)
			}
			pt.Hists[v.Key] = h
		case Counter:
			pt.Counters[v.Key] = sumCounter(fam, v.Match)
		}
	}
	return pt, nil
}

func labelsOf(m *dto.Metric) Labels {
	l := make(Labels, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

func sumHist(fam *dto.MetricFamily, match func(Labels) bool) (Hist, error) {
	var h Hist
	if fam == nil {
		return h, nil // not exposed yet: no request of that kind so far
	}
	for _, m := range fam.GetMetric() {
		if match != nil && !match(labelsOf(m)) {
			continue
		}
		src := m.GetHistogram()
		if src == nil {
			return Hist{}, fmt.Errorf("not a histogram")
		}
		bounds := make([]float64, 0, len(src.GetBucket()))
		counts := make([]float64, 0, len(src.GetBucket()))
		for _, b := range src.GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) {
				continue
			}
			bounds = append(bounds, b.GetUpperBound())
			counts = append(counts, float64(b.GetCumulativeCount()))
		}
		if h.Bounds == nil {
			h.Bounds, h.Counts = bounds, make([]float64, len(bounds))
		} else if !slices.Equal(h.Bounds, bounds) {
			return Hist{}, fmt.Errorf("series with different buckets")
		}
		for i, c := range counts {
			h.Counts[i] += c
		}
		h.Count += float64(src.GetSampleCount())
		h.Sum += src.GetSampleSum()
	}
	return h, nil
}

func sumCounter(fam *dto.MetricFamily, match func(Labels) bool) float64 {
	var sum float64
	for _, m := range fam.GetMetric() {
		if match != nil && !match(labelsOf(m)) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// Sub returns the samples observed after earlier. A histogram that did not
// exist earlier (no such request yet) subtracts as empty.
func (h Hist) Sub(earlier Hist) Hist {
	if earlier.Bounds == nil {
		return h
	}
	if h.Bounds == nil {
		return Hist{}
	}
	out := Hist{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts)), Count: h.Count - earlier.Count, Sum: h.Sum - earlier.Sum}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i] - earlier.Counts[i]
	}
	return out
}

// Quantile is PromQL's histogram_quantile: the bucket holding the q-th
// sample, interpolated linearly inside it (from 0 for the first bucket); a
// rank in the +Inf bucket answers the highest finite bound. NaN without
// samples.
func (h Hist) Quantile(q float64) float64 {
	if h.Count <= 0 || len(h.Bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, upper := range h.Bounds {
		if h.Counts[i] >= rank {
			in := h.Counts[i] - below
			if in <= 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/in
		}
		lower, below = upper, h.Counts[i]
	}
	return h.Bounds[len(h.Bounds)-1]
}

// Mean is Sum/Count, NaN without samples.
func (h Hist) Mean() float64 {
	if h.Count <= 0 {
		return math.NaN()
	}
	return h.Sum / h.Count
}
