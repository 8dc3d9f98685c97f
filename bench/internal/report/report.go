// Package report renders benchmark results as markdown tables.
package report

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// Report is a whole run.
type Report struct {
	Title   string
	Header  []string // bullet lines printed under the title
	Servers []string // column order
	Base    string   // server the ratios are computed for ("" = none)
	Rows    []string // row order
	Results map[string]map[string]workload.Result
}

// New returns an empty report.
func New(title string, servers []string, base string) *Report {
	return &Report{Title: title, Servers: servers, Base: base, Results: map[string]map[string]workload.Result{}}
}

// Add records one result (rows keep their first-seen order).
func (r *Report) Add(res workload.Result) {
	m, ok := r.Results[res.Row]
	if !ok {
		m = map[string]workload.Result{}
		r.Results[res.Row] = m
		r.Rows = append(r.Rows, res.Row)
	}
	m[res.Server] = res
}

func (r *Report) others() []string {
	var o []string
	if r.Base == "" {
		return nil
	}
	has := false
	for _, s := range r.Servers {
		if s == r.Base {
			has = true
		} else {
			o = append(o, s)
		}
	}
	if !has {
		return nil
	}
	return o
}

// Ratio returns base vs other normalised so that > 1 means base is better.
func Ratio(base, other workload.Result) (float64, bool) {
	if base.NA != "" || other.NA != "" || base.Value <= 0 || other.Value <= 0 {
		return 0, false
	}
	if base.Kind.HigherIsBetter() {
		return base.Value / other.Value, true
	}
	return other.Value / base.Value, true
}

func unit(k workload.Kind) string {
	switch k {
	case workload.Throughput:
		return "ops/s ↑"
	case workload.Time:
		return "ms ↓"
	case workload.Bytes:
		return "MiB ↓"
	}
	return ""
}

func formatValue(res workload.Result) string {
	if res.NA != "" {
		return "n/a"
	}
	switch res.Kind {
	case workload.Throughput:
		return formatNum(res.Value)
	case workload.Time:
		return formatMS(time.Duration(res.Value * float64(time.Second)))
	case workload.Bytes:
		return fmt.Sprintf("%.1f", res.Value/(1<<20))
	}
	return fmt.Sprint(res.Value)
}

func formatNum(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// formatMS renders a duration in milliseconds with 3 significant digits.
func formatMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f", ms)
	case ms >= 1:
		return fmt.Sprintf("%.2f", ms)
	default:
		return fmt.Sprintf("%.3f", ms)
	}
}

func p99(res workload.Result) string {
	if res.NA != "" || res.P99 == 0 {
		return "–"
	}
	return formatMS(res.P99)
}

func kindOf(m map[string]workload.Result) workload.Kind {
	for _, r := range m {
		if r.NA == "" {
			return r.Kind
		}
	}
	for _, r := range m {
		return r.Kind
	}
	return workload.Throughput
}

func esc(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// Markdown writes the report.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "# %s\n\n", r.Title)
	for _, h := range r.Header {
		fmt.Fprintf(w, "- %s\n", h)
	}
	if len(r.Header) > 0 {
		fmt.Fprintln(w)
	}
	others := r.others()
	cols := []string{"workload", "unit"}
	for _, s := range r.Servers {
		cols = append(cols, s, s+" p99 ms")
	}
	for _, o := range others {
		cols = append(cols, r.Base+"/"+o)
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
	seps := make([]string, len(cols))
	for i := range seps {
		if i < 2 {
			seps[i] = "---"
		} else {
			seps[i] = "---:"
		}
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
	caveats := false
	for _, row := range r.Rows {
		m := r.Results[row]
		cells := []string{esc(row), unit(kindOf(m))}
		for _, s := range r.Servers {
			res, ok := m[s]
			if !ok {
				cells = append(cells, "–", "–")
				continue
			}
			v := formatValue(res)
			if res.NA == "" && res.Caveat != "" {
				v += " (" + esc(res.Caveat) + ")"
				caveats = true
			}
			cells = append(cells, v, p99(res))
		}
		for _, o := range others {
			b, ok1 := m[r.Base]
			x, ok2 := m[o]
			if v, ok := Ratio(b, x); ok && ok1 && ok2 {
				if b.Caveat != "" || x.Caveat != "" {
					cells = append(cells, fmt.Sprintf("(%.2f×)", v))
				} else {
					cells = append(cells, fmt.Sprintf("%.2f×", v))
				}
			} else {
				cells = append(cells, "–")
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	if caveats {
		fmt.Fprintf(w, "\nValues and ratios in parentheses are not directly comparable: the server was saturated (the writer fell below its target rate, or events were still undelivered after the grace period).\n")
	}
	if len(others) > 0 {
		fmt.Fprintf(w, "\nRatios are normalised so that > 1 means %s is better (throughput: %s/other; times and memory: other/%s).\n", r.Base, r.Base, r.Base)
	}

	fmt.Fprintf(w, "\n## Details\n\n")
	fmt.Fprintf(w, "| workload | server | ops | errors | p50 ms | p99 ms | max ms | notes |\n|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		for _, s := range r.Servers {
			res, ok := r.Results[row][s]
			if !ok {
				continue
			}
			if res.NA != "" {
				fmt.Fprintf(w, "| %s | %s | | | | | | n/a: %s |\n", esc(row), s, esc(res.NA))
				continue
			}
			ms := func(d time.Duration) string {
				if d == 0 {
					return ""
				}
				return formatMS(d)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %s | %s | %s |\n", esc(row), s, res.Ops, res.Errors,
				ms(res.P50), ms(res.P99), ms(res.Max), esc(res.Note))
		}
	}
}
