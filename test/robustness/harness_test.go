package robustness

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/identity"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
)

// long selects the long runs (make robustness); the default is the short
// version make test runs.
var long = os.Getenv("ROBUSTNESS_LONG") != ""

// failpoint is a fault injected while the traffic runs, the counterpart of
// etcd's robustness/failpoint for an externally started fdb-etcd.
type failpoint interface {
	name() string
	// inject runs the fault. Reports are extra client reports to validate
	// (e.g. a stalled watcher's); summary says what was injected.
	inject(ctx context.Context, t *testing.T, s *server, env *runEnv) (reports []report.ClientReport, summary string, err error)
}

// target is what a run's traffic goes to: one fdb-etcd on the embedded
// store (server), or replicas on a FoundationDB cluster (fdbTarget).
type target interface {
	endpoints() []string
	// stop ends every fdb-etcd process gracefully and fails the test if one
	// does not stop cleanly.
	stop()
	// exportPersisted returns, once stopped, the requests the target
	// persisted, checked against etcd's model.
	exportPersisted() ([]model.EtcdRequest, error)
	// faultCounts are counters of what was injected (storage faults), or
	// of what the replicas' FoundationDB clients met, for the summary.
	faultCounts() map[string]int64
	// reportFiles are what a failed run's report keeps: data directories
	// and logs (name -> path).
	reportFiles() (dataDirs, logs map[string]string)
}

// injectFunc runs a scenario's fault against its target.
type injectFunc func(ctx context.Context, env *runEnv) (reports []report.ClientReport, summary string, err error)

// runEnv is what a failpoint may use to record its own clients.
type runEnv struct {
	ids      identity.Provider
	baseTime time.Time
	lg       *zap.Logger
}

type scenario struct {
	name       string
	traffic    traffic.Traffic
	profile    traffic.Profile
	serverArgs []string
	failpoint  failpoint
	// before and after are the traffic time around the failpoint.
	before, after time.Duration
	// minSuccesses is the fewest successful KV operations for a
	// meaningful run (etcd requires a minimal QPS; this machine is shared).
	minSuccesses int
	// control re-validates with a persisted revision removed, which must
	// fail: evidence that the validation is not vacuous.
	control bool
}

// outcome is one validated run, for the summary.
type outcome struct {
	scenario                   string
	kvOps, kvOK, kvFailed      int
	watchReqs, watchEvents     int
	persisted, maxRev          int64
	failpoint                  string
	faults                     map[string]int64
	linearization, watch, seri string
	revChecked                 int
	// extra are scenario-specific result lines (FoundationDB runs: errors
	// by code, write unavailability, readiness, leases).
	extra []string
}

var (
	outcomesMu sync.Mutex
	outcomes   []outcome
)

func init() {
	// The suite's 200 ms request timeout assumes a dedicated machine; this
	// one is shared with builds. Timeouts only turn into failed (unknown
	// outcome) operations, which validation handles; longer ones keep the
	// linearization search small.
	traffic.RequestTimeout = time.Second
	traffic.WatchTimeout = 2 * time.Second
}

func runScenario(t *testing.T, sc scenario) {
	srv := startServer(t, sc.serverArgs...)
	res := runOn(t, sc, srv, func(ctx context.Context, env *runEnv) ([]report.ClientReport, string, error) {
		r, summary, err := sc.failpoint.inject(ctx, t, srv, env)
		if err != nil {
			err = fmt.Errorf("%s: %w", sc.failpoint.name(), err)
		}
		return r, summary, err
	})
	record(t, res.outcome)
}

// runResult is a validated run: what the clients saw, and the summary.
type runResult struct {
	reports   []report.ClientReport
	persisted []model.EtcdRequest
	baseTime  time.Time
	outcome   outcome
}

// runOn drives tg with the scenario's traffic while inject runs its fault,
// stops tg and validates everything the clients saw against what tg
// persisted. It fails t (and returns nil) when validation fails.
func runOn(t *testing.T, sc scenario, tg target, inject injectFunc) *runResult {
	lg := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	endpoints := tg.endpoints()
	ctx, cancel := context.WithTimeout(context.Background(), sc.before+sc.after+5*time.Minute)
	defer cancel()

	baseTime := time.Now()
	ids := identity.NewIDProvider()
	env := &runEnv{ids: ids, baseTime: baseTime, lg: lg}
	trafficSet := client.NewSet(ids, baseTime)
	defer trafficSet.Close()
	watchSet := client.NewSet(ids, baseTime)
	defer watchSet.Close()

	var fpReports []report.ClientReport
	var fpSummary string
	fpDone := make(chan struct{})
	var g errgroup.Group
	g.Go(func() error {
		defer close(fpDone)
		time.Sleep(jitter(sc.before))
		r, summary, err := inject(ctx, env)
		fpReports, fpSummary = r, summary
		if err != nil {
			cancel()
			return fmt.Errorf("failpoint %s: %w", sc.name, err)
		}
		time.Sleep(jitter(sc.after))
		return nil
	})
	maxRevision := make(chan int64, 1)
	var kvReports []report.ClientReport
	g.Go(func() error {
		defer close(maxRevision)
		r, err := simulateTraffic(ctx, lg, endpoints, sc, fpDone, trafficSet)
		if err != nil {
			return err
		}
		kvReports = r
		maxRevision <- report.OperationsMaxRevision(r)
		return nil
	})
	g.Go(func() error {
		return client.CollectClusterWatchEvents(ctx, client.CollectClusterWatchEventsParam{
			Lg: lg, Endpoints: endpoints, MaxRevisionChan: maxRevision, ClientSet: watchSet,
		})
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	reports := slices.Concat(kvReports, watchSet.Reports(), fpReports)
	tg.stop()
	persisted, err := tg.exportPersisted()
	if err != nil {
		t.Fatalf("exporting persisted requests: %v", err)
	}
	if len(persisted) == 0 {
		t.Fatal("no persisted requests exported")
	}

	checked, revErr := checkAgainstPersisted(reports, persisted)
	if revErr != nil {
		t.Errorf("a response disagrees with the persisted history: %v", revErr)
	}
	result := validate.ValidateAndReturnVisualize(lg, validate.Config{ExpectRevisionUnique: sc.traffic.ExpectUniqueRevision()},
		reports, persisted, 5*time.Minute)
	o := summarize(sc, reports, persisted, fpSummary, tg.faultCounts())
	o.linearization = string(result.Linearization.Status)
	o.watch, o.seri = resultString(result.Watch), resultString(result.Serializable)
	o.revChecked = checked
	t.Logf("%s: %d KV ops (%d ok, %d failed), %d watches with %d events, %d persisted requests up to revision %d; failpoint: %s; fault counters: %v; linearization %s, watch %s, serializable %s; %d responses match the persisted history",
		sc.name, o.kvOps, o.kvOK, o.kvFailed, o.watchReqs, o.watchEvents, o.persisted, o.maxRev, o.failpoint, o.faults, o.linearization, o.watch, o.seri, o.revChecked)
	if err := result.Error(); err != nil {
		dir := saveReport(t, lg, tg, reports, sc, result)
		t.Fatalf("validation failed: %v (report in %s)", err, dir)
	}
	if sc.control {
		controlDetectsLoss(t, lg, sc, reports, persisted)
	}
	if o.kvOK < sc.minSuccesses {
		t.Fatalf("only %d successful KV operations, want at least %d for a meaningful run", o.kvOK, sc.minSuccesses)
	}
	return &runResult{reports: reports, persisted: persisted, baseTime: baseTime, outcome: o}
}

// record adds a validated run to the summary TestZSummary prints.
func record(t *testing.T, o outcome) {
	outcomesMu.Lock()
	outcomes = append(outcomes, o)
	outcomesMu.Unlock()
	for _, line := range o.extra {
		t.Logf("%s: %s", o.scenario, line)
	}
}

func resultString(r validate.Result) string {
	if err := r.Error(); err != nil {
		return "FAILED: " + err.Error()
	}
	return string(r.Status)
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	j := d / 5
	return d - j + time.Duration(rand.Int63n(int64(2*j)+1))
}

func saveReport(t *testing.T, lg *zap.Logger, tg target, reports []report.ClientReport, sc scenario, result validate.RobustnessResult) string {
	base := os.Getenv("RESULTS_DIR")
	if base == "" {
		base = filepath.Join(os.TempDir(), "fdb-etcd-robustness")
	}
	dir := filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"), fmt.Sprint(time.Now().UnixNano()))
	dataDirs, logs := tg.reportFiles()
	r, err := report.NewTestReport(lg, dir, dataDirs,
		&report.TrafficDetail{ExpectUniqueRevision: sc.traffic.ExpectUniqueRevision()})
	if err != nil {
		t.Log(err)
		return ""
	}
	r.SetClientReports(reports)
	if result.Linearization.Error() == nil {
		r.SetVisualizer(result.Linearization.Visualize)
	}
	if err := r.Finalize(true, false); err != nil {
		t.Log(err)
	}
	for name, path := range logs {
		if b, err := os.ReadFile(path); err == nil {
			_ = os.WriteFile(filepath.Join(dir, name), b, 0o600)
		}
	}
	return dir
}

func summarize(sc scenario, reports []report.ClientReport, persisted []model.EtcdRequest, fp string, faults map[string]int64) outcome {
	o := outcome{scenario: sc.name, persisted: int64(len(persisted)), failpoint: fp, faults: faults}
	for _, r := range reports {
		for _, op := range r.KeyValue {
			o.kvOps++
			resp := op.Output.(model.MaybeEtcdResponse)
			if resp.Error == "" {
				o.kvOK++
				o.maxRev = max(o.maxRev, resp.Revision)
			} else {
				o.kvFailed++
			}
		}
		o.watchReqs += len(r.Watch)
		o.watchEvents += r.WatchEventCount()
	}
	return o
}

// simulateTraffic is traffic.SimulateTraffic for an endpoint list instead of
// an e2e cluster: the same key-value, watch and compaction loops, limiter and
// key stores, the final write that must succeed, and the traffic report.
func simulateTraffic(ctx context.Context, lg *zap.Logger, endpoints []string, sc scenario, failpointDone <-chan struct{}, cs *client.ClientSet) ([]report.ClientReport, error) {
	profile := sc.profile
	limiter := rate.NewLimiter(rate.Limit(profile.KeyValue.MaximalQPS), profile.KeyValue.BurstableQPS)
	if err := traffic.CheckEmptyDatabaseAtStart(ctx, lg, endpoints, cs); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	finish := make(chan struct{})
	keyStore := traffic.NewKeyStore(10, "key")
	k8s := traffic.NewKubernetesStorage()
	err := traffic.SimulateKeyValueTraffic(ctx, &wg, profile.KeyValue, endpoints, cs, sc.traffic, traffic.RunTrafficLoopParam{
		QPSLimiter:                         limiter,
		IDs:                                cs.IdentityProvider(),
		LeaseIDStorage:                     identity.NewLeaseIDStorage(),
		NonUniqueRequestConcurrencyLimiter: traffic.NewConcurrencyLimiter(profile.KeyValue.MaxNonUniqueRequestConcurrency),
		KeyStore:                           keyStore,
		Storage:                            k8s,
		Finish:                             finish,
	})
	if err != nil {
		return nil, err
	}
	if profile.Watch != nil {
		if err := traffic.SimulateWatchTraffic(ctx, &wg, profile.Watch, endpoints, cs, sc.traffic, traffic.RunWatchLoopParam{
			Config: *profile.Watch, QPSLimiter: limiter, KeyStore: keyStore, Storage: k8s, Finish: finish, Logger: lg,
		}); err != nil {
			return nil, err
		}
	}
	if profile.Compaction != nil {
		if err := traffic.SimulateCompactionTraffic(ctx, &wg, profile.Compaction, endpoints, cs, sc.traffic, traffic.RunCompactLoopParam{
			Period: profile.Compaction.Period, Finish: finish,
		}); err != nil {
			return nil, err
		}
	}
	select {
	case <-failpointDone:
	case <-ctx.Done():
		close(finish)
		wg.Wait()
		return nil, fmt.Errorf("traffic finished before the failpoint: %w", ctx.Err())
	}
	close(finish)
	wg.Wait()
	time.Sleep(time.Second)
	// Validation requires the last operation to succeed.
	cc, err := cs.NewClient(endpoints)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	for attempt := 0; ; attempt++ {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = cc.Put(pctx, "tombstone", "true")
		pcancel()
		if err == nil {
			break
		}
		// A failed attempt is recorded too and stays a valid history; only
		// the final write must succeed.
		if attempt == 5 || ctx.Err() != nil {
			return nil, fmt.Errorf("last operation failed, validation requires it to succeed: %w", err)
		}
	}
	return cs.Reports(), nil
}

// controlDetectsLoss drops one persisted write from the middle of the
// history, as a server that lost it would, and requires validation to fail.
func controlDetectsLoss(t *testing.T, lg *zap.Logger, sc scenario, reports []report.ClientReport, persisted []model.EtcdRequest) {
	for i := len(persisted) / 2; i < len(persisted); i++ {
		r := persisted[i]
		if r.Type != model.Txn || len(r.Txn.OperationsOnSuccess) == 0 || r.Txn.OperationsOnSuccess[0].Type != model.PutOperation {
			continue
		}
		tampered := slices.Delete(slices.Clone(persisted), i, i+1)
		// The watch reports and one read at revision 1 (the validators'
		// empty-start assumption) keep this cheap: no second linearization.
		var watchOnly []report.ClientReport
		for _, r := range reports {
			w := report.ClientReport{ClientID: r.ClientID, Watch: r.Watch}
			for _, op := range r.KeyValue {
				req, resp := op.Input.(model.EtcdRequest), op.Output.(model.MaybeEtcdResponse)
				if req.IsRead() && resp.Error == "" && resp.Revision == 1 {
					w.KeyValue = append(w.KeyValue, op)
					break
				}
			}
			watchOnly = append(watchOnly, w)
		}
		res := validate.ValidateAndReturnVisualize(zap.NewNop(), validate.Config{ExpectRevisionUnique: sc.traffic.ExpectUniqueRevision()},
			watchOnly, tampered, time.Minute)
		if res.Error() == nil {
			t.Fatalf("control: validation passed with persisted request %d (a put) removed", i)
		}
		t.Logf("control: removing persisted put %d makes validation fail: %v", i, res.Error())
		return
	}
	t.Fatal("control: no persisted put to remove")
}
