// Package report renders benchmark results as markdown tables.
package report

import (
	"fmt"
	"io"
	"slices"
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
	// Comparisons are further tables, printed after the main one.
	Comparisons []Comparison
	// Cores is the host's processor count, against which the CPU table
	// shows how busy the host was; 0 leaves that out.
	Cores int
}

// Comparison is a table of each subject's values next to those of a few
// references, with subject/reference ratios (fdb-etcd on FoundationDB
// against etcd and against the plain FoundationDB client).
type Comparison struct {
	Title      string
	Text       string // a paragraph under the title
	Subjects   []string
	References []string
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
	if !hasValue(base) || !hasValue(other) || base.Value <= 0 || other.Value <= 0 {
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

func hasValue(res workload.Result) bool { return res.NA == "" && res.NoEquivalent == "" }

func formatValue(res workload.Result) string {
	if res.NoEquivalent != "" {
		return "–"
	}
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
	if !hasValue(res) || res.P99 == 0 {
		return "–"
	}
	return formatMS(res.P99)
}

// rowUnit is the unit of a row, "" when no server has a value in it.
func rowUnit(m map[string]workload.Result) string {
	for _, r := range m {
		if hasValue(r) {
			return unit(r.Kind)
		}
	}
	return ""
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
		cells := []string{esc(row), rowUnit(m)}
		for _, s := range r.Servers {
			res, ok := m[s]
			if !ok {
				cells = append(cells, "–", "–")
				continue
			}
			cells = append(cells, valueCell(res), p99(res))
			caveats = caveats || (hasValue(res) && res.Caveat != "")
		}
		for _, o := range others {
			cells = append(cells, ratioCell(m, r.Base, o))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	if caveats {
		fmt.Fprintf(w, "\n%s\n", caveatNote)
	}
	if len(others) > 0 {
		fmt.Fprintf(w, "\nRatios are normalised so that > 1 means %s is better (throughput: %s/other; times and memory: other/%s).\n", r.Base, r.Base, r.Base)
	}
	for _, c := range r.Comparisons {
		r.comparison(w, c)
	}
	r.cpu(w)
	r.details(w)
}

// cpu writes where the closed-loop rows spent their CPU: per operation, in
// the server, in the fdbservers and in the load generator, and how much of
// the host's processors the three used together.
func (r *Report) cpu(w io.Writer) {
	var rows []string
	for _, row := range r.Rows {
		for _, res := range r.Results[row] {
			if res.CPU != nil && res.Ops > 0 {
				rows = append(rows, row)
				break
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## CPU per operation\n\n")
	fmt.Fprintf(w, "Microseconds of CPU per successful operation during each closed-loop row: the server's processes (every replica) / every fdbserver on the host / the load generator (the harness, or the plain FoundationDB client, which generates its own load)")
	if r.Cores > 0 {
		fmt.Fprintf(w, ", then the share of the host's %d processors the three used together", r.Cores)
	}
	fmt.Fprintf(w, ". Times are read from /proc in 10 ms ticks.\n\n")
	cols := append([]string{"workload"}, r.Servers...)
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, row := range rows {
		cells := []string{esc(row)}
		for _, s := range r.Servers {
			cells = append(cells, r.cpuCell(r.Results[row][s]))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

func (r *Report) cpuCell(res workload.Result) string {
	if res.CPU == nil || res.Ops == 0 {
		return "–"
	}
	per := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(res.Ops)) }
	c := res.CPU
	cell := per(c.Server) + " / " + per(c.Store) + " / " + per(c.Client)
	if r.Cores > 0 && res.Elapsed > 0 {
		busy := float64(c.Server+c.Store+c.Client) / float64(res.Elapsed) / float64(r.Cores)
		cell += fmt.Sprintf(", %.0f%%", 100*busy)
	}
	return cell
}

// details writes every result's counts, latencies and notes.
func (r *Report) details(w io.Writer) {
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
			if res.NoEquivalent != "" {
				fmt.Fprintf(w, "| %s | %s | | | | | | no equivalent: %s |\n", esc(row), s, esc(res.NoEquivalent))
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

const caveatNote = "Values and ratios in parentheses are not directly comparable: the server was saturated (the writer fell below its target rate, or events were still undelivered after the grace period)."

// valueCell is a result's value, with its caveat in parentheses.
func valueCell(res workload.Result) string {
	v := formatValue(res)
	if hasValue(res) && res.Caveat != "" {
		v += " (" + esc(res.Caveat) + ")"
	}
	return v
}

// ratioCell is a's value against b's in one row, normalised so that > 1
// means a is better, in parentheses when either carries a caveat.
func ratioCell(m map[string]workload.Result, a, b string) string {
	x, ok1 := m[a]
	y, ok2 := m[b]
	v, ok := Ratio(x, y)
	switch {
	case !ok || !ok1 || !ok2:
		return "–"
	case x.Caveat != "" || y.Caveat != "":
		return fmt.Sprintf("(%.2f×)", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// present keeps the servers of names that are in the report.
func (r *Report) present(names []string) []string {
	var out []string
	for _, n := range names {
		if slices.Contains(r.Servers, n) {
			out = append(out, n)
		}
	}
	return out
}

// comparison writes one comparison table: the references' values, then
// each subject's value and its ratios against every reference. Rows no
// subject has a result for are left out.
func (r *Report) comparison(w io.Writer, c Comparison) {
	subjects, refs := r.present(c.Subjects), r.present(c.References)
	if len(subjects) == 0 || len(refs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## %s\n\n", c.Title)
	if c.Text != "" {
		fmt.Fprintf(w, "%s\n\n", c.Text)
	}
	cols := append([]string{"workload", "unit"}, refs...)
	for _, s := range subjects {
		cols = append(cols, s)
		for _, ref := range refs {
			cols = append(cols, s+"/"+ref)
		}
	}
	fmt.Fprintf(w, "| %s |\n|---|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---:|", len(cols)-2))
	caveats := false
	for _, row := range r.Rows {
		m := r.Results[row]
		if !slices.ContainsFunc(subjects, func(s string) bool { _, ok := m[s]; return ok }) {
			continue
		}
		cells := []string{esc(row), rowUnit(m)}
		for _, ref := range refs {
			cells = append(cells, cell(m, ref))
		}
		for _, s := range subjects {
			cells = append(cells, cell(m, s))
			for _, ref := range refs {
				cells = append(cells, ratioCell(m, s, ref))
			}
		}
		for _, res := range m {
			caveats = caveats || (hasValue(res) && res.Caveat != "")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	if caveats {
		fmt.Fprintf(w, "\n%s\n", caveatNote)
	}
	fmt.Fprintf(w, "\nRatios are normalised so that > 1 means the first server is better (throughput: it/other; times: other/it); a dash is a row without a value or without an equivalent (the details table says which).\n")
}

// cell is server s's value in a row, or a dash if it has none.
func cell(m map[string]workload.Result, s string) string {
	res, ok := m[s]
	if !ok {
		return "–"
	}
	return valueCell(res)
}

// RatioEntry is one ratio of a comparison table.
type RatioEntry struct {
	Row     string  `json:"row"`
	Server  string  `json:"server"`
	Against string  `json:"against"`
	Ratio   float64 `json:"ratio"` // > 1: Server is better
	// Caveat: either value carries a caveat, so the ratio is not directly
	// comparable (parenthesised in the table).
	Caveat bool `json:"caveat,omitempty"`
}

// ComparisonRatios lists every ratio the comparison tables show.
func (r *Report) ComparisonRatios() []RatioEntry {
	var out []RatioEntry
	for _, c := range r.Comparisons {
		subjects, refs := r.present(c.Subjects), r.present(c.References)
		for _, row := range r.Rows {
			m := r.Results[row]
			for _, s := range subjects {
				for _, ref := range refs {
					v, ok := Ratio(m[s], m[ref])
					if !ok {
						continue
					}
					out = append(out, RatioEntry{Row: row, Server: s, Against: ref, Ratio: v, Caveat: m[s].Caveat != "" || m[ref].Caveat != ""})
				}
			}
		}
	}
	return out
}
