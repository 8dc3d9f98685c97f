package scenarios

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// Consistent LISTs of a quiet resource, which kube-apiserver serves from its
// watch cache once a progress notification (RequestProgress on the cache's
// watch stream) proves the cache fresh: the same requests on every store of
// the run, in interleaved blocks so that all of them meet the same machine.
const (
	freshLists   = 500                    // consistent LISTs per store
	freshBlocks  = 5                      // blocks per store, taken in turn
	freshPacing  = 150 * time.Millisecond // between LISTs, as a polling client
	freshWrites  = 20 * time.Millisecond  // ~50 ConfigMap writes/s elsewhere
	freshQuiet   = 60 * time.Second       // no write to the quiet resource for this long first
	freshWarm    = 2 * time.Second        // writes run this long before a block's first LIST
	freshObjects = 20
	freshNS      = "quiet"
	freshGoal    = 1.2 // p99 within this factor of etcd's
)

// freshness is one store's result in one run.
type freshness struct {
	durs              []time.Duration // sorted
	fallbacks, served float64
	writes            int64
	took              time.Duration // wall time of its blocks
}

func (f *freshness) q(p float64) time.Duration {
	return f.durs[int(p*float64(len(f.durs)-1))]
}

var (
	freshMu   sync.Mutex
	freshRuns []map[string]*freshness // one per run of the test (-count)
)

// TestConsistentListFromCache measures consistent LISTs of LimitRanges that
// nothing writes, while ConfigMaps take ~50 writes/s, on kube-apiserver over
// each store of the run, and reports p50/p99/p99.9 and the reads that fell
// back to etcd. Every LIST must be served from the watch cache with no
// fallback (apiserver_watch_cache_consistent_read_total{fallback="true"}) on
// fdb-etcd; latencies are measured against etcd's, not judged.
func TestConsistentListFromCache(t *testing.T) {
	if _, err := fdbetcd.Binary(); err != nil {
		t.Fatal(err)
	}
	var cs []*cluster
	for _, be := range stores() {
		c := startStack(t, be)
		freshSetup(t, c)
		cs = append(cs, c)
	}
	quietSince := time.Now()
	ctx := ctxT(t, 30*time.Minute)
	before := map[string]string{}
	for _, c := range cs {
		ensureNamespace(t, c, "churn")
	}
	if d := time.Until(quietSince.Add(freshQuiet)); d > 0 {
		t.Logf("waiting %v so that limitranges have been quiet for %v", d.Round(time.Second), freshQuiet)
		time.Sleep(d)
	}
	answersBefore := map[string][3]float64{}
	grvBefore := map[string]map[float64]float64{}
	for _, c := range cs {
		m, err := c.metrics(ctx)
		must(t, err, "metrics of %s", c.store.name)
		before[c.store.name] = m
		answersBefore[c.store.name] = progressAnswers(c.store)
		grvBefore[c.store.name] = readVersions(c.store)
	}
	res := map[string]*freshness{}
	for _, c := range cs {
		res[c.store.name] = &freshness{}
	}
	for block := 0; block < freshBlocks; block++ {
		for k := range cs {
			c := cs[(k+block)%len(cs)]
			freshBlock(t, ctx, c, res[c.store.name], freshLists/freshBlocks)
		}
	}
	for _, c := range cs {
		f := res[c.store.name]
		after, err := c.metrics(ctx)
		must(t, err, "metrics of %s", c.store.name)
		f.fallbacks = metricSum(after, "apiserver_watch_cache_consistent_read_total", `fallback="true"`) -
			metricSum(before[c.store.name], "apiserver_watch_cache_consistent_read_total", `fallback="true"`)
		f.served = metricSum(after, "apiserver_watch_cache_consistent_read_total", `fallback="false"`, `resource="limitranges"`) -
			metricSum(before[c.store.name], "apiserver_watch_cache_consistent_read_total", `fallback="false"`, `resource="limitranges"`)
		sort.Slice(f.durs, func(i, j int) bool { return f.durs[i] < f.durs[j] })
		t.Logf("%s: %d consistent LISTs during %d ConfigMap writes (%.0f/s): p50 %v p99 %v p99.9 %v max %v; served from the watch cache %v, fallbacks %v",
			c.store.name, len(f.durs), f.writes, float64(f.writes)/f.took.Seconds(), f.q(0.5), f.q(0.99), f.q(0.999), f.q(1), f.served, f.fallbacks)
		rv := bucketsDelta(buckets(after, "etcd_request_duration_seconds", `operation="getCurrentResourceVersion"`, `limitranges`),
			buckets(before[c.store.name], "etcd_request_duration_seconds", `operation="getCurrentResourceVersion"`, `limitranges`))
		t.Logf("%s: the LISTs' current-revision reads, as kube-apiserver times them: %v, %v over 5 ms",
			c.store.name, rv[math.Inf(1)], rv[math.Inf(1)]-rv[0.005])
		if g := bucketsDelta(readVersions(c.store), grvBefore[c.store.name]); g[math.Inf(1)] > 0 {
			t.Logf("%s: FoundationDB read versions of its members meanwhile (every transaction): %v, p50 <= %v, p99 <= %v, p99.9 <= %v",
				c.store.name, g[math.Inf(1)], bucketQuantile(g, 0.5), bucketQuantile(g, 0.99), bucketQuantile(g, 0.999))
		}
		if c.store.reference {
			continue // measured, not judged
		}
		a, b := progressAnswers(c.store), answersBefore[c.store.name]
		t.Logf("%s: progress requests answered meanwhile: %v from memory, %v after a read of the head, %v second notifications at a newer head",
			c.store.name, a[0]-b[0], a[1]-b[1], a[2]-b[2])
		if f.fallbacks != 0 {
			t.Errorf("%s: apiserver_watch_cache_consistent_read_total{fallback=\"true\"} rose by %v", c.store.name, f.fallbacks)
		}
		if f.served < float64(len(f.durs)) {
			t.Errorf("%s: only %v of %d consistent LISTs were served from the watch cache", c.store.name, f.served, len(f.durs))
		}
	}
	freshMu.Lock()
	freshRuns = append(freshRuns, res)
	freshMu.Unlock()
}

// freshSetup creates the quiet resource's objects.
func freshSetup(t *testing.T, c *cluster) {
	ensureNamespace(t, c, freshNS)
	ctx := ctxT(t, time.Minute)
	for i := 0; i < freshObjects; i++ {
		_, err := c.client.CoreV1().LimitRanges(freshNS).Create(ctx, &corev1.LimitRange{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("lr", i)},
			Spec:       corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer}}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create limitrange on %s: %v", c.store.name, err)
		}
	}
}

// freshBlock makes n consistent LISTs on c, paced, while c's ConfigMaps take
// writes.
func freshBlock(t *testing.T, ctx context.Context, c *cluster, f *freshness, n int) {
	stop := startWriter(t, c, "churn", freshWrites)
	start := time.Now()
	time.Sleep(freshWarm)
	for i := 0; i < n; i++ {
		st := time.Now()
		l, err := c.client.CoreV1().LimitRanges(freshNS).List(ctx, metav1.ListOptions{}) // RV="": consistent
		d := time.Since(st)
		if d > time.Second {
			t.Logf("%s: a consistent LIST took %v (%s to %s)", c.store.name, d, st.Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
		}
		must(t, err, "consistent list on %s", c.store.name)
		if len(l.Items) != freshObjects {
			t.Fatalf("consistent list on %s: %d items, want %d", c.store.name, len(l.Items), freshObjects)
		}
		f.durs = append(f.durs, d)
		time.Sleep(freshPacing)
	}
	f.writes += stop()
	f.took += time.Since(start)
}

// freshnessReport is the latency table of every run of the test.
func freshnessReport() string {
	freshMu.Lock()
	defer freshMu.Unlock()
	if len(freshRuns) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nConsistent LISTs of a quiet resource (limitranges) from the watch cache, %d per store in %d interleaved blocks, one per %v, while ConfigMaps take ~%d writes/s; goal: p99 <= etcd's x %.1f, no fallback:\n\n",
		freshLists, freshBlocks, freshPacing, int(time.Second/freshWrites), freshGoal)
	b.WriteString("| run | store | p50 | p90 | p99 | p99.9 | max | fallbacks | served from cache | writes/s | p99 / etcd's |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, run := range freshRuns {
		ref := run[storeEtcd]
		for _, be := range stores() {
			f, ok := run[be]
			if !ok || len(f.durs) == 0 {
				continue
			}
			ratio := "-"
			if ref != nil && len(ref.durs) > 0 && be != storeEtcd {
				r := float64(f.q(0.99)) / float64(ref.q(0.99))
				ratio = fmt.Sprintf("%.2f (%s)", r, map[bool]string{true: "goal met", false: "goal missed"}[r <= freshGoal])
			}
			rd := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
			fmt.Fprintf(&b, "| %d | %s | %v | %v | %v | %v | %v | %v | %v | %.0f | %s |\n", i+1, storeTitles[be],
				rd(f.q(0.5)), rd(f.q(0.9)), rd(f.q(0.99)), rd(f.q(0.999)), rd(f.q(1)), f.fallbacks, f.served, float64(f.writes)/f.took.Seconds(), ratio)
		}
	}
	return b.String()
}

// progressAnswers sums fdb-etcd's progress answers over a store's members:
// from memory, after a read of the head, second notifications.
func progressAnswers(s *store) [3]float64 {
	var out [3]float64
	for _, u := range s.urls {
		m := scrape(u + "/metrics")
		for i, how := range []string{"memory", "read", "followup"} {
			out[i] += metricSum(m, "fdb_etcd_watch_progress_answers_total", `how="`+how+`"`)
		}
	}
	return out
}

// readVersions sums the FoundationDB read-version histograms of a store's
// members (fdb_etcd_fdb_read_version_duration_seconds; empty off
// FoundationDB).
func readVersions(s *store) map[float64]float64 {
	out := map[float64]float64{}
	for _, u := range s.urls {
		for le, n := range buckets(scrape(u+"/metrics"), "fdb_etcd_fdb_read_version_duration_seconds") {
			out[le] += n
		}
	}
	return out
}

// buckets returns a histogram's cumulative bucket counts by upper bound,
// summed over the series whose labels contain every given pair.
func buckets(text, name string, labels ...string) map[float64]float64 {
	out := map[float64]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"_bucket{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		i := strings.Index(line, `le="`)
		if !ok || i < 0 {
			continue
		}
		j := strings.Index(line[i+4:], `"`)
		le, err := strconv.ParseFloat(line[i+4:i+4+j], 64)
		f := strings.Fields(line)
		v, err2 := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil && err2 == nil {
			out[le] += v
		}
	}
	return out
}

func bucketsDelta(after, before map[float64]float64) map[float64]float64 {
	out := map[float64]float64{}
	for le, n := range after {
		out[le] = n - before[le]
	}
	return out
}

// bucketQuantile is the upper bound of the bucket holding quantile q.
func bucketQuantile(b map[float64]float64, q float64) time.Duration {
	les := make([]float64, 0, len(b))
	for le := range b {
		les = append(les, le)
	}
	sort.Float64s(les)
	total := b[math.Inf(1)]
	for _, le := range les {
		if b[le] >= q*total {
			if math.IsInf(le, 1) {
				return -1
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return -1
}
