package storage

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// resultRecord is one case's result on one backend as a run writes it
// (-results), so that the runs of the three backends, each a process of its
// own, make one table (-merge).
type resultRecord struct {
	Case    string  `json:"case"`
	Backend string  `json:"backend"`
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
}

// saveResults writes every recorded result to path, cases in run order.
func saveResults(path string) error {
	resultsMu.Lock()
	var recs []resultRecord
	for _, name := range caseOrder {
		for be, r := range results[name] {
			recs = append(recs, resultRecord{Case: name, Backend: be, Status: r.status, Seconds: r.dur.Seconds()})
		}
	}
	resultsMu.Unlock()
	b, err := json.MarshalIndent(recs, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// loadResults records the results of earlier runs' files, in their order.
func loadResults(paths []string) error {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var recs []resultRecord
		if err := json.Unmarshal(b, &recs); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, r := range recs {
			record(r.Case, r.Backend, result{status: r.Status, dur: time.Duration(r.Seconds * float64(time.Second))})
		}
	}
	return nil
}
