package robustness

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
)

// maxWriteRecovery is how soon writes must succeed again once FoundationDB
// has recovered.
const maxWriteRecovery = 5 * time.Second

// TestRobustnessFDB runs fdb-etcd on FoundationDB (three replicas on a
// 5-process double ssd-2 cluster) with etcd's traffic under each of
// FoundationDB's failures, validates every run with etcd's validators like
// TestRobustness, and checks what only a FoundationDB run can show: errors
// clients see are etcd's, writes come back within 5 s of FoundationDB's
// recovery, /readyz follows the store, and leases expire exactly once.
func TestRobustnessFDB(t *testing.T) {
	// Requests wait out an outage instead of failing with an unknown
	// outcome, as kube-apiserver's do: every unknown write multiplies the
	// linearization search, and with etcd's 1 s four forced recoveries made
	// porcupine time out and a whole-cluster restart exhaust memory.
	defer func(d time.Duration) { traffic.RequestTimeout = d }(traffic.RequestTimeout)
	traffic.RequestTimeout = fdbRequestTimeout
	for _, fault := range fdbFaults() {
		for _, p := range fdbProfiles() {
			if !long && !shortFDBPair(fault.name, p.name) {
				continue
			}
			t.Run(fault.name+"/"+p.name, func(t *testing.T) {
				bin := requireFDB(t)
				f := startFDBTarget(t, bin, fault.args...)
				sc := scenario{
					name: "FDB/" + fault.name + "/" + p.name, traffic: p.traffic, profile: p.profile,
					before: span(3*time.Second, 10*time.Second), after: span(3*time.Second, 10*time.Second),
					minSuccesses: int(span(200, 2000)),
				}
				res := runOn(t, sc, f, func(ctx context.Context, _ *runEnv) ([]report.ClientReport, string, error) {
					summary, err := fault.run(ctx, f)
					return nil, summary, err
				})
				res.outcome.extra = checkFDBRun(t, f, fault, res)
				record(t, res.outcome)
			})
		}
	}
}

// fdbRequestTimeout is the traffic's request timeout on FoundationDB.
const fdbRequestTimeout = 10 * time.Second

// fdbProfiles are profiles() at KeyValueMedium's rate in long runs too: a
// 5-process cluster on a shared machine commits fewer writes than the
// embedded store, and a longer history of the same rate is what long runs
// add.
func fdbProfiles() []trafficProfile {
	ps := profiles()
	for i := range ps {
		kv := traffic.KeyValueMedium
		ps[i].profile.KeyValue = &kv
	}
	return ps
}

// shortFDBPair is what make test runs on FoundationDB: forced recoveries
// (with a replica killed) under etcd's traffic.
func shortFDBPair(fault, profile string) bool {
	return fault == "ForcedRecovery" && strings.HasPrefix(profile, "Etcd")
}

// checkFDBRun checks a validated FoundationDB run and returns its result
// lines for the summary.
func checkFDBRun(t *testing.T, f *fdbTarget, fault fdbFault, res *runResult) []string {
	var lines []string
	byKind, bad := clientErrors(res.reports)
	lines = append(lines, "client errors: "+formatCounts(byKind))
	for _, b := range bad {
		t.Errorf("a client saw an error that is not etcd's: %s", b)
	}
	server := f.faultCounts()
	lines = append(lines, "server: "+formatCounts(server))
	for _, code := range []string{"grpc-Unknown", "grpc-Internal"} {
		if n := server[code]; n > 0 {
			t.Errorf("replicas answered %d unary requests with %s", n, strings.TrimPrefix(code, "grpc-"))
		}
	}
	lines = append(lines, checkWrites(t, f, res))
	lines = append(lines, checkReadiness(t, f, fault))
	lines = append(lines, checkLeases(t, f))
	return lines
}

var rpcCode = regexp.MustCompile(`^rpc error: code = (\w+) desc = `)

// clientErrors counts the errors clients saw by kind and returns the ones
// etcd would never give: gRPC Unknown or Internal, or anything that is
// neither an etcd error nor a gRPC status.
func clientErrors(reports []report.ClientReport) (map[string]int64, []string) {
	byKind := map[string]int64{}
	var bad []string
	for _, r := range reports {
		for _, op := range r.KeyValue {
			resp := op.Output.(model.MaybeEtcdResponse)
			msg := resp.Error + resp.ClientError
			if msg == "" {
				continue
			}
			kind, ok := errorKind(msg)
			byKind[kind]++
			if !ok && len(bad) < 20 {
				bad = append(bad, msg)
			}
		}
	}
	return byKind, bad
}

// errorKind names an error message: etcd's own ("etcdserver: ...",
// "mvcc: ..."), the client's timeout, or a gRPC code. ok is false for
// errors etcd does not give.
func errorKind(msg string) (string, bool) {
	switch {
	case strings.HasPrefix(msg, "etcdserver: "), strings.HasPrefix(msg, "mvcc: "):
		return msg, true
	case msg == "context deadline exceeded":
		return "client timeout", true
	}
	if m := rpcCode.FindStringSubmatch(msg); m != nil {
		switch m[1] {
		case "Unknown", "Internal":
			return m[1], false
		}
		return m[1], true
	}
	return "other", false
}

func formatCounts[V int64 | int](m map[string]V) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// checkWrites measures the longest time without a successful write, and how
// long after each of FoundationDB's recoveries the first write succeeded.
func checkWrites(t *testing.T, f *fdbTarget, res *runResult) string {
	var oks []time.Time
	for _, r := range res.reports {
		for _, op := range r.KeyValue {
			req, resp := op.Input.(model.EtcdRequest), op.Output.(model.MaybeEtcdResponse)
			if req.Type == model.Txn && !req.IsRead() && resp.Error == "" {
				oks = append(oks, res.baseTime.Add(time.Duration(op.Return)))
			}
		}
	}
	slices.SortFunc(oks, func(a, b time.Time) int { return a.Compare(b) })
	var longest time.Duration
	var longestAt time.Time
	for i := 1; i < len(oks); i++ {
		if d := oks[i].Sub(oks[i-1]); d > longest {
			longest, longestAt = d, oks[i-1]
		}
	}
	var after []string
	for _, ev := range f.events() {
		if ev.what != evFDBAvailable {
			continue
		}
		i, _ := slices.BinarySearchFunc(oks, ev.at, func(a, b time.Time) int { return a.Compare(b) })
		if i == len(oks) {
			t.Errorf("no write succeeded after FoundationDB recovered at %v", ev.at.Format(time.TimeOnly))
			continue
		}
		d := oks[i].Sub(ev.at)
		after = append(after, d.Round(10*time.Millisecond).String())
		if d > maxWriteRecovery {
			t.Errorf("the first write after FoundationDB recovered succeeded %v later, want within %v", d, maxWriteRecovery)
		}
	}
	return fmt.Sprintf("writes: %d succeeded; longest without one %v (from %v after the run began); first write after each FoundationDB recovery: %s",
		len(oks), longest.Round(10*time.Millisecond), longestAt.Sub(res.baseTime).Round(100*time.Millisecond), strings.Join(after, ", "))
}

// checkReadiness: every replica ends ready; during a FoundationDB outage
// every replica that was running said it was not.
func checkReadiness(t *testing.T, f *fdbTarget, fault fdbFault) string {
	var outageStart, outageEnd time.Time
	for _, ev := range f.events() {
		switch {
		case ev.what == evFault && outageStart.IsZero():
			outageStart = ev.at
		case ev.what == evFDBAvailable && outageEnd.IsZero():
			outageEnd = ev.at
		}
	}
	var parts []string
	for _, s := range append(append([]*server{}, f.replicas...), f.leases...) {
		h := f.monitor.history(s)
		notReady, longest, sawOutage := 0, time.Duration(0), false
		for i, r := range h {
			if r.ready {
				continue
			}
			notReady++
			end := time.Now()
			if i+1 < len(h) {
				end = h[i+1].at
			}
			longest = max(longest, end.Sub(r.at))
			if !outageStart.IsZero() && r.at.Before(outageEnd.Add(readyTimeout)) && end.After(outageStart) {
				sawOutage = true
			}
		}
		if len(h) == 0 || !h[len(h)-1].ready {
			t.Errorf("%s did not become ready again by the end of the run", s.name())
		}
		if fault.outage && !sawOutage {
			t.Errorf("%s never reported itself not ready while FoundationDB was down", s.name())
		}
		parts = append(parts, fmt.Sprintf("%s %d× not ready (longest %v)", s.name(), notReady, longest.Round(100*time.Millisecond)))
	}
	return "readyz: " + strings.Join(parts, ", ")
}

// checkLeases reports and checks the lease probe's findings, with the
// lease keyspace's persisted history.
func checkLeases(t *testing.T, f *fdbTarget) string {
	r := f.probed
	export, err := f.export(f.prefix + "/leases")
	if err != nil {
		t.Errorf("lease keyspace: %v", err)
	} else if _, err := toModelRequests(export); err != nil {
		t.Errorf("lease keyspace history: %v", err)
	} else {
		r.checkRevokes(export, f.probe.expiredLeases())
	}
	for _, p := range r.problems {
		t.Errorf("leases: %s", p)
	}
	if r.expired == 0 {
		t.Errorf("leases: no probe lease expired")
	}
	return fmt.Sprintf("leases: %d granted, %d keys, %d expired exactly once, latest expiry %v after its TTL; probe errors: %s",
		r.grants, r.keys, r.expired, r.maxDelay.Round(100*time.Millisecond), formatCounts(r.errs))
}
