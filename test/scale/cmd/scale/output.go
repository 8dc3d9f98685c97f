package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/report"
)

// write puts report.md, p99.png and results.json in the output directory
// and prints the targets' summary.
func (h *harness) write(results []report.Result) error {
	sections := report.Sections(results)
	verdicts := report.Targets(sections)
	var kinds []string
	for _, r := range results {
		kinds = append(kinds, r.Kind)
	}
	var md strings.Builder
	md.WriteString("# Kubernetes at scale: etcd and fdb-etcd side by side\n\n```\n" + h.header + "```\n\n")
	for _, r := range results {
		fmt.Fprintf(&md, "- %s: %s\n", r.Title, status(r))
	}
	md.WriteString("\nLatencies are p99 over the whole measured phase, from the apiserver's histograms as PromQL's histogram_quantile computes them (linear inside a bucket; apiserver_request_duration_seconds' buckets start at 5 ms, 25 ms, 50 ms), except the rows marked harness, measured by the harness itself (±4.4 %).\n\n")
	md.WriteString(report.Markdown(sections, kinds))
	md.WriteString(report.TargetsMarkdown(verdicts))
	md.WriteString("\n![p99 over time](p99.png)\n")
	if err := os.WriteFile(filepath.Join(h.o.out, "report.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(h.o.out, "p99.png"))
	if err != nil {
		return err
	}
	if err := report.Plot(f, results, h.o.window); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(h.o.out, "results.json"), results, sections, verdicts); err != nil {
		return err
	}
	h.printSummary(verdicts)
	return nil
}

func status(r report.Result) string {
	switch {
	case r.Err != "":
		return "FAILED: " + firstLine(r.Err)
	case !r.Measured():
		return "no measured phase"
	}
	s := fmt.Sprintf("set up in %v, measured %v", r.Setup.Round(1e9), r.Phase().To.At.Round(1e9))
	for _, e := range r.Summary.FirstErrors {
		s += "; error: " + firstLine(e)
	}
	return s
}

// jsonRow is one row of results.json; NaN (nothing measured) is null.
type jsonRow struct {
	Section string              `json:"section"`
	Name    string              `json:"name"`
	Values  map[string]*float64 `json:"values"`
}

func writeJSON(path string, results []report.Result, sections []report.Section, verdicts []report.Verdict) error {
	out := struct {
		Stores  map[string]string `json:"stores"`
		Errors  map[string]string `json:"errors,omitempty"`
		Rows    []jsonRow         `json:"rows"`
		Targets []report.Verdict  `json:"targets"`
	}{Stores: map[string]string{}, Errors: map[string]string{}, Targets: verdicts}
	for _, r := range results {
		out.Stores[r.Kind] = r.Title
		if r.Err != "" {
			out.Errors[r.Kind] = r.Err
		}
	}
	for _, s := range sections {
		for _, r := range s.Rows {
			jr := jsonRow{Section: s.Title, Name: r.Name, Values: map[string]*float64{}}
			for k, v := range r.Values {
				if !math.IsNaN(v) {
					jr.Values[k] = &v
				} else {
					jr.Values[k] = nil
				}
			}
			out.Rows = append(out.Rows, jr)
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func (h *harness) printSummary(vs []report.Verdict) {
	held := 0
	for _, v := range vs {
		if v.Holds {
			held++
		}
	}
	h.logf("targets: %d of %d hold", held, len(vs))
	for _, v := range vs {
		if !v.Holds {
			h.logf("  missed: %s: %s: %s", v.Row, v.Target, v.Detail)
		}
	}
	h.logf("report: %s, plot: %s, numbers: %s", filepath.Join(h.o.out, "report.md"), filepath.Join(h.o.out, "p99.png"), filepath.Join(h.o.out, "results.json"))
}
