package robustness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
)

// checkAgainstPersisted is a check in addition to etcd's validation, cheap
// enough to always run and conclusive when porcupine times out: every
// successful Range (at the current revision) and Txn response must be what
// etcd's model answers for that request on the persisted history at the
// response's revision (for a read or a txn that wrote nothing) or just before
// it (for a txn that wrote it). It ignores real time, which porcupine checks.
func checkAgainstPersisted(reports []report.ClientReport, persisted []model.EtcdRequest) (checked int, err error) {
	seen := map[string]bool{}
	addKeys := func(r model.EtcdRequest) {
		switch r.Type {
		case model.Range:
			seen[r.Range.Start] = true
			if r.Range.End != "" {
				seen[r.Range.End] = true
			}
		case model.Txn:
			for _, c := range r.Txn.Conditions {
				seen[c.Key] = true
			}
			for _, op := range r.Txn.AllOperations() {
				seen[op.Range.Start] = true
				seen[op.Range.End] = true
				seen[op.Put.Key] = true
				seen[op.Delete.Key] = true
			}
		}
	}
	for _, r := range persisted {
		addKeys(r)
	}
	for _, c := range reports {
		for _, op := range c.KeyValue {
			addKeys(op.Input.(model.EtcdRequest))
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	state := model.DeterministicModel(keys).Init().(model.EtcdState)
	states := []model.EtcdState{state, state} // index = revision
	// states[R] is the last state at revision R: it includes the lease
	// grants and revokes and compactions made before revision R+1, which a
	// write taking R+1 depends on (reads do not).
	for _, r := range persisted {
		next, _ := state.Step(r)
		if next.Revision != state.Revision {
			states = append(states, next)
		} else {
			states[len(states)-1] = next
		}
		state = next
	}
	step := func(s model.EtcdState, req model.EtcdRequest) (resp model.MaybeEtcdResponse, ok bool) {
		defer func() {
			if recover() != nil {
				ok = false
			}
		}()
		_, resp = s.Step(req)
		return resp, true
	}
	for _, c := range reports {
		for _, op := range c.KeyValue {
			req := op.Input.(model.EtcdRequest)
			resp := op.Output.(model.MaybeEtcdResponse)
			if resp.Error != "" || resp.ClientError != "" || resp.Persisted {
				continue
			}
			if !(req.Type == model.Range && req.Range.Revision == 0) && req.Type != model.Txn {
				continue
			}
			rev := resp.Revision
			if rev < 1 || rev >= int64(len(states)) {
				return checked, fmt.Errorf("client %d: %s answered at revision %d; the persisted history ends at %d",
					c.ClientID, describe(req), rev, len(states)-1)
			}
			matched := false
			var want model.MaybeEtcdResponse
			for _, base := range []int64{rev, rev - 1} {
				if base < 1 {
					continue
				}
				w, ok := step(states[base], req)
				if ok && model.Match(model.MaybeEtcdResponse{EtcdResponse: resp.EtcdResponse}, w) {
					matched = true
					break
				}
				if base == rev {
					want = w
				}
			}
			if !matched {
				return checked, fmt.Errorf("client %d at %v: %s answered %+v at revision %d; on the persisted history it answers %+v",
					c.ClientID, time.Duration(op.Call), describe(req), resp.EtcdResponse, rev, want.EtcdResponse)
			}
			checked++
		}
	}
	return checked, nil
}

func describe(r model.EtcdRequest) string {
	switch r.Type {
	case model.Range:
		return fmt.Sprintf("range %+v", *r.Range)
	case model.Txn:
		return fmt.Sprintf("txn %+v", *r.Txn)
	}
	return string(r.Type)
}

// TestAnalyzeSavedReport re-validates a report a failed run saved
// (ROBUSTNESS_REPORT=<dir with client-*/ and server-fdb-etcd/>), with the
// per-revision check and etcd's validation under ROBUSTNESS_TIMEOUT
// (default 30m).
func TestAnalyzeSavedReport(t *testing.T) {
	dir := os.Getenv("ROBUSTNESS_REPORT")
	if dir == "" {
		t.Skip("ROBUSTNESS_REPORT not set")
	}
	reports, err := report.LoadClientReports(dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "experimental-export-persisted", "--data-dir", filepath.Join(dir, "server-fdb-etcd")).Output()
	if err != nil {
		t.Fatal(err)
	}
	persisted, err := toModelRequests(out)
	if err != nil {
		t.Fatal(err)
	}
	n, err := checkAgainstPersisted(reports, persisted)
	t.Logf("per-revision check: %d responses consistent with %d persisted requests; err %v", n, len(persisted), err)
	timeout := 30 * time.Minute
	if s := os.Getenv("ROBUSTNESS_TIMEOUT"); s != "" {
		if timeout, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	unique := os.Getenv("ROBUSTNESS_UNIQUE") != ""
	res := validate.ValidateAndReturnVisualize(zaptest.NewLogger(t), validate.Config{ExpectRevisionUnique: unique}, reports, persisted, timeout)
	t.Logf("linearization %s, watch %s, serializable %s", res.Linearization.Status, resultString(res.Watch), resultString(res.Serializable))
	if err := res.Error(); err != nil {
		t.Fatal(err)
	}
}
