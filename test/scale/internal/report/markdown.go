package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/stores"
)

// fdbFactor is how far above etcd's an SLI may be on FoundationDB.
const fdbFactor = 1.5

// Format prints a value in its unit; "–" when nothing was measured.
func Format(v float64, u Unit) string {
	if math.IsNaN(v) {
		return "–"
	}
	switch u {
	case Seconds:
		switch {
		case v < 0.01:
			return fmt.Sprintf("%.2f ms", v*1000)
		case v < 1:
			return fmt.Sprintf("%.1f ms", v*1000)
		default:
			return fmt.Sprintf("%.2f s", v)
		}
	case Bytes:
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	case CPUSeconds:
		return fmt.Sprintf("%.1f s", v)
	case Rate:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// Markdown renders the sections as tables with one column per store kind
// that ran, then the targets.
func Markdown(sections []Section, kinds []string) string {
	var b strings.Builder
	for _, s := range sections {
		fmt.Fprintf(&b, "### %s\n\n| | %s | SLO |\n|---|", s.Title, titles(kinds))
		b.WriteString(strings.Repeat("---|", len(kinds)+1) + "\n")
		for _, r := range s.Rows {
			if r.OmitEmpty && empty(r) {
				continue
			}
			cells := make([]string, len(kinds))
			for i, k := range kinds {
				v, ok := r.Values[k]
				cells[i] = "not run"
				if ok {
					cells[i] = Format(v, r.Unit)
				}
			}
			slo := ""
			if r.SLO > 0 {
				slo = "≤ " + Format(r.SLO, r.Unit)
			} else if r.Zero {
				slo = "0"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", r.Name, strings.Join(cells, " | "), slo)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func empty(r Row) bool {
	for _, v := range r.Values {
		if !math.IsNaN(v) {
			return false
		}
	}
	return true
}

func titles(kinds []string) string {
	t := make([]string, len(kinds))
	for i, k := range kinds {
		t[i] = stores.Title(k)
	}
	return strings.Join(t, " | ")
}

// Verdict is one target on one row.
type Verdict struct {
	Row, Target string
	Holds       bool
	Detail      string
}

// Targets judges the rows: on Pebble every compared SLI at or below
// etcd's; on FoundationDB every latency SLI within its SLO and within 1.5×
// etcd's; every must-be-zero row 0 on every store. A row a store did not
// measure (no requests of that kind) is left out.
func Targets(sections []Section) []Verdict {
	var out []Verdict
	for _, s := range sections {
		for _, r := range s.Rows {
			out = append(out, judge(r)...)
		}
	}
	return out
}

func judge(r Row) []Verdict {
	var out []Verdict
	etcd, okE := measured(r, stores.Etcd)
	if r.Zero {
		for _, k := range stores.Kinds {
			if v, ok := measured(r, k); ok {
				out = append(out, Verdict{r.Name, stores.Title(k) + ": 0", v == 0, Format(v, r.Unit)})
			}
		}
		return out
	}
	if !r.Compare {
		return nil
	}
	if peb, ok := measured(r, stores.Pebble); ok && okE {
		out = append(out, Verdict{r.Name, "Pebble ≤ etcd", peb <= etcd, ratio(peb, etcd, r.Unit)})
	}
	fdb, okF := measured(r, stores.FDB)
	if !okF {
		return out
	}
	if r.SLO > 0 {
		out = append(out, Verdict{r.Name, "FoundationDB ≤ SLO", fdb <= r.SLO, Format(fdb, r.Unit) + " vs " + Format(r.SLO, r.Unit)})
	}
	if okE && r.Unit == Seconds {
		out = append(out, Verdict{r.Name, "FoundationDB ≤ 1.5× etcd", fdb <= fdbFactor*etcd, ratio(fdb, etcd, r.Unit)})
	}
	return out
}

func measured(r Row, kind string) (float64, bool) {
	v, ok := r.Values[kind]
	return v, ok && !math.IsNaN(v)
}

func ratio(v, ref float64, u Unit) string {
	s := Format(v, u) + " vs " + Format(ref, u)
	if ref > 0 {
		s += fmt.Sprintf(" (%.2f×)", v/ref)
	}
	return s
}

// TargetsMarkdown lists the verdicts, misses first.
func TargetsMarkdown(vs []Verdict) string {
	var b strings.Builder
	held := 0
	for _, v := range vs {
		if v.Holds {
			held++
		}
	}
	fmt.Fprintf(&b, "### Targets: %d of %d hold\n\n| SLI | target | holds | values |\n|---|---|---|---|\n", held, len(vs))
	for _, pass := range []bool{false, true} {
		for _, v := range vs {
			if v.Holds == pass {
				mark := "yes"
				if !v.Holds {
					mark = "**no**"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", v.Row, v.Target, mark, v.Detail)
			}
		}
	}
	return b.String()
}
