package storagetest

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// TestReference runs the suite on the in-memory reference backend.
func TestReference(t *testing.T) {
	Run(t, func(*testing.T) storage.DB { return newMemDB(mutant{}) })
}

// mutants each break the reference backend in one way, with the conformance
// tests that must catch it. benign ones behave in ways the contract allows
// (and FoundationDB does), so the whole suite must still pass.
var mutants = []struct {
	m      mutant
	kills  []string
	benign bool
	anyOf  bool // at least one of kills must fail, not each
}{
	{m: mutant{name: "absentIsEmpty", absentIsEmpty: true}, kills: []string{"GetAbsent", "SetGetClear", "GetMany"}},
	{m: mutant{name: "clearNoop", clearNoop: true}, kills: []string{"SetGetClear", "ReadYourWrites"}},
	{m: mutant{name: "noReverse", noReverse: true}, kills: []string{"GetRange", "GetRangePaging", "KeyOrder", "ReadYourWrites"}},
	{m: mutant{name: "noLimit", noLimit: true}, kills: []string{"GetRange", "GetRangePaging", "KeyOrder", "ReadYourWrites"}},
	{m: mutant{name: "reverseLimitBug", reverseLimitBug: true}, kills: []string{"GetRange", "GetRangePaging", "KeyOrder", "ReadYourWrites"}},
	{m: mutant{name: "nilEndUnbounded", nilEndUnbounded: true}, kills: []string{"GetRange", "ClearRange"}},
	{m: mutant{name: "signedOrder", signedOrder: true}, kills: []string{"KeyOrder", "MaxSizes"}},
	{m: mutant{name: "emptyIsAbsent", emptyIsAbsent: true}, kills: []string{"EmptyValue", "ReadYourWrites", "GetManySorted"}},
	{m: mutant{name: "getManySorted", getManySorted: true}, kills: []string{"GetMany", "GetManySorted"}},
	{m: mutant{name: "getManyNoRYW", getManyNoRYW: true}, kills: []string{"GetMany", "GetManySorted", "ReadYourWrites"}},
	{m: mutant{name: "batchLastRange", batchLastRange: true}, kills: []string{"ReadBatch"}},
	{m: mutant{name: "scanNoStop", scanNoStop: true}, kills: []string{"Scanner", "Scan"}},
	{m: mutant{name: "scanNilEnd", scanNilEnd: true}, kills: []string{"Scanner"}},
	{m: mutant{name: "aliasValues", aliasValues: true}, kills: []string{"SlicesOwnedByCaller"}},
	{m: mutant{name: "truncValues", truncValues: true}, kills: []string{"MaxSizes", "LargeTransaction"}},
	{m: mutant{name: "truncKeys", truncKeys: true}, kills: []string{"MaxSizes"}},
	{m: mutant{name: "liveView", liveView: true}, kills: []string{"ViewSnapshot", "ViewConsistentUnderWrites"}},
	// Lost counter updates need goroutines to interleave, which a loaded
	// host under -race may not do; the write-skew test is deterministic, so
	// either serializability test failing is enough.
	{m: mutant{name: "noSerialize", noSerialize: true}, kills: []string{"SerializableCounter", "SerializableWriteSkew"}, anyOf: true},
	{m: mutant{name: "noRollback", noRollback: true}, kills: []string{"Rollback", "ReadYourWrites"}},
	{m: mutant{name: "noRYW", noRYW: true}, kills: []string{"ReadYourWrites", "GetMany", "GetManySorted", "Scanner"}},
	{m: mutant{name: "noClearRangeRYW", noClearRangeRYW: true}, kills: []string{"ReadYourWrites", "GetMany", "GetManySorted", "Scanner"}},
	{m: mutant{name: "clearRangeIncl", clearRangeIncl: true}, kills: []string{"ClearRange"}},
	{m: mutant{name: "noRetry", noRetry: true}, kills: []string{"RetryableErrorFromFn", "RetryEndsWithContext"}},
	{m: mutant{name: "noViewRetry", noViewRetry: true}, kills: []string{"ViewRetries", "RetryEndsWithContext"}},
	{m: mutant{name: "retryForever", retryForever: true}, kills: []string{"RetryEndsWithContext", "CanceledContext"}},
	{m: mutant{name: "noCtxCheck", noCtxCheck: true}, kills: []string{"CanceledContext"}},
	{m: mutant{name: "waitNoBlock", waitNoBlock: true}, kills: []string{"WaitChangeBlocksUntilCommit", "WaitChangeAbsent", "WaitChangeContext"}},
	{m: mutant{name: "waitNilIsEmpty", waitNilIsEmpty: true}, kills: []string{"WaitChangeImmediate"}},
	{m: mutant{name: "waitIgnoresCtx", waitIgnoresCtx: true}, kills: []string{"WaitChangeContext"}},
	{m: mutant{name: "waitNoWake", waitNoWake: true}, kills: []string{"WaitChangeBlocksUntilCommit", "WaitChangeAbsent", "WaitChangeOwnCommit"}},
	{m: mutant{name: "wakeLate", wakeLate: true}, kills: []string{"WaitChangeOwnCommit"}},
	{m: mutant{name: "noClosed", noClosed: true}, kills: []string{"Closed"}},
	{m: mutant{name: "closeNoWake", closeNoWake: true}, kills: []string{"CloseWakesWaiters"}},
	{m: mutant{name: "panicAfterClose", panicAfterClose: true}, kills: []string{"CloseWhileBusy"}},
	{m: mutant{name: "bigTxFails", bigTxFails: true}, kills: []string{"LargeTransaction"}},
	{m: mutant{name: "loseCommits", loseCommits: true}, kills: []string{"IdempotentRepeats", "SerializableCounter"}},
	{m: mutant{name: "recentStale", recentStale: true}, kills: []string{"RecentViewMonotonic"}},
	{m: mutant{name: "snapshotFixed", snapshotFixed: true}, kills: []string{"Snapshotter"}},

	{m: mutant{name: "repeatCommits", repeatCommits: true}, benign: true},
	{m: mutant{name: "spuriousWake", spuriousWake: true}, benign: true},
	{m: mutant{name: "repeatCommitsSpuriousWake", repeatCommits: true, spuriousWake: true}, benign: true},
}

const mutantEnv = "STORAGETEST_MUTANT"

// TestMutantChild runs the suite on one mutant, in a child process started by
// TestMutants (a hang or a panic there is then only a failed child).
func TestMutantChild(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("run by TestMutants")
	}
	for _, mt := range mutants {
		if mt.m.name == name {
			Run(t, func(*testing.T) storage.DB { return newMemDB(mt.m) })
			return
		}
	}
	t.Fatalf("no mutant %q", name)
}

// TestMutants shows that the suite can fail: every mutant must fail each of
// the tests listed for it, and every benign one must pass the whole suite.
func TestMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process per mutant")
	}
	if os.Getenv(mutantEnv) != "" {
		t.Skip("in a child")
	}
	killed := map[string]bool{}
	for _, mt := range mutants {
		for _, k := range mt.kills {
			killed[k] = true
		}
	}
	for _, name := range Tests() {
		switch {
		case killed[name]:
		case name == "Strinc", name == "Sizer", name == "WaitChangeLoop":
			// Strinc is not the backend's; memDB has no Sizer; WaitChangeLoop
			// is a liveness check (waitNoWake would only time out, slowly).
		default:
			t.Errorf("no mutant shows that %s can fail", name)
		}
	}
	for _, mt := range mutants {
		t.Run(mt.m.name, func(t *testing.T) {
			t.Parallel()
			run := "^TestMutantChild$"
			if !mt.benign {
				run += "/^(" + strings.Join(mt.kills, "|") + ")$"
			}
			cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), mutantEnv+"="+mt.m.name)
			out, err := cmd.CombinedOutput()
			if mt.benign {
				if err != nil {
					t.Errorf("the suite failed on a backend with allowed behaviour (%v):\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("the suite passed on mutant %s:\n%s", mt.m.name, out)
			}
			failedAny := false
			for _, k := range mt.kills {
				re := regexp.MustCompile(fmt.Sprintf(`--- FAIL: TestMutantChild/%s \(`, regexp.QuoteMeta(k)))
				crashed := mt.m.panicAfterClose && strings.Contains(string(out), "memdb: used after Close")
				failed := re.Match(out) || crashed
				failedAny = failedAny || failed
				if !failed && !mt.anyOf {
					t.Errorf("%s did not fail on mutant %s:\n%s", k, mt.m.name, out)
				}
			}
			if mt.anyOf && !failedAny {
				t.Errorf("none of %v failed on mutant %s:\n%s", mt.kills, mt.m.name, out)
			}
		})
	}
}
