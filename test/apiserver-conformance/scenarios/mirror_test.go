package scenarios

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// envMirror=0 skips TestMirrorCutover (about a minute; make
// conformance-mirror runs it alone).
const envMirror = "CONFORMANCE_MIRROR"

// The cut-overs TestMirrorCutover can make (-mirror-cutover).
const (
	// cutAddress keeps kube-apiserver running: its --etcd-servers names an
	// address that moves from etcd to fdb-etcd, as a DNS name or a load
	// balancer in front of etcd would.
	cutAddress = "address"
	// cutRestart stops kube-apiserver and starts it again with
	// --etcd-servers naming fdb-etcd (docs/operations.md's steps).
	cutRestart = "restart"
	// cutRestartEtcd stops kube-apiserver and starts it again on the same
	// etcd: the reference for what a restart alone does to informers.
	cutRestartEtcd = "restart-etcd"
)

var flagMirrorCutover = flag.String("mirror-cutover", cutAddress,
	"TestMirrorCutover: address (kube-apiserver keeps running, its etcd address moves to fdb-etcd), restart (kube-apiserver restarted on fdb-etcd) or restart-etcd (restarted on the same etcd, no mirror cut-over)")

const (
	mirrorBefore = 5 * time.Second        // workload on etcd before the mirror starts
	mirrorFollow = 20 * time.Second       // workload while the mirror follows
	mirrorAfter  = 10 * time.Second       // workload on fdb-etcd after the cut-over
	mirrorSample = 100 * time.Millisecond // between lag samples
	mirrorWait   = 2 * time.Minute        // for the mirror to follow, or to catch up
)

// mirrorProc is a running `fdb-etcd mirror`.
type mirrorProc struct {
	p          *proc
	metricsURL string
}

// mirrorStack is kube-apiserver on etcd through a switchable address, with
// the workload, and the fdb-etcd serving the mirrored store once it runs.
type mirrorStack struct {
	dir     string
	src     *store
	stopSrc sync.Once
	proxy   *switchProxy
	c       *cluster
	target  *store // where kube-apiserver's storage is after the cut-over
	w       *workload
	leases  *leaseInformer
}

// TestMirrorCutover runs kube-apiserver on etcd with a client-go workload
// (two writers, consistent LISTs, a watch, a ConfigMap informer and a Lease
// informer), mirrors the etcd with `fdb-etcd mirror` while the workload
// goes on, and cuts over: writes paused, etcd's writer cut off (its address
// switched off, or kube-apiserver stopped), zero lag, mirror stopped,
// fdb-etcd started on the mirrored store, kube-apiserver's storage on it,
// writes resumed. The informers and the watch must go on from their
// resourceVersions without a relist, every object must hold its last
// acknowledged write, and resourceVersions must keep growing across the
// cut-over.
func TestMirrorCutover(t *testing.T) {
	if os.Getenv(envMirror) == "0" {
		t.Skipf("%s=0", envMirror)
	}
	start := time.Now()
	t.Cleanup(func() {
		status := "PASS"
		if t.Failed() {
			status = "FAIL"
		}
		recordScenario("MirrorCutover", storeEmbedded, status, time.Since(start))
	})
	mode := *flagMirrorCutover
	if !slices.Contains([]string{cutAddress, cutRestart, cutRestartEtcd}, mode) {
		t.Fatalf("-mirror-cutover=%s: address, restart or restart-etcd", mode)
	}
	bin, err := fdbetcd.Binary()
	must(t, err, "fdb-etcd binary")
	ms := startMirrorStack(t)
	time.Sleep(mirrorBefore)
	m := startMirror(t, bin, ms.dir, ms.src.urls[0])
	t.Cleanup(func() { m.p.stop(syscall.SIGKILL) })
	must(t, m.waitLag(t, mirrorWait, 1), "the mirror following etcd")
	lag := m.sampleLag(t, mirrorFollow)
	lastBefore := ms.w.lastAckRV()

	cut := time.Now()
	rev := ms.stopWriter(t, mode)
	must(t, m.waitRevision(t, mirrorWait, rev), "the mirror reaching etcd's revision %d", rev)
	applyP50, applyP99 := m.stop(t)
	ms.switchStorage(t, mode)
	downtime := time.Since(cut)
	resumed := time.Now()
	ms.w.resumeWrites(ms.c, 2*faultObjects, 1)
	must(t, ms.w.waitWrite(resumed, time.Minute), "a write after the cut-over")
	ms.w.downtime.Store(false)
	time.Sleep(mirrorAfter)

	ms.w.verify(t, ms.c, func(string) { t.Logf("store log tail:\n%s", tail(ms.target.logs(), 3000)) })
	checkMirrorState(t, ms.c, ms.w, lastBefore, rev, resumed)
	ms.leases.check(t, ms.c)
	t.Logf("cut-over %s to %s; mirror lag over %v of workload: %s; apply lag p50 %s, p99 %s (the mirror's log); writes down %v from pause to resume; etcd revision at the cut-over %d",
		mode, ms.target.name, mirrorFollow, lag, applyP50, applyP99, downtime.Round(time.Millisecond), rev)
}

// startMirrorStack starts etcd, the address in front of it, kube-apiserver
// on that address, and the workload; all stop when t ends.
func startMirrorStack(t *testing.T) *mirrorStack {
	dir, err := os.MkdirTemp("", "conformance-mirror-")
	must(t, err, "temp dir")
	ms := &mirrorStack{dir: dir}
	ms.src, err = startEmbeddedEtcd(dir)
	must(t, err, "starting etcd")
	ms.proxy, err = startSwitchProxy(ms.src.urls[0])
	must(t, err, "the etcd address")
	front := &store{name: "etcd", urls: []string{ms.proxy.url()}, client: ms.src.client, logs: ms.src.logs}
	ms.c, err = startCluster(t, front, dir)
	t.Cleanup(func() {
		if ms.c != nil {
			ms.c.stop()
		}
		ms.proxy.close()
		ms.stopSrc.Do(ms.src.stop)
		if ms.target != nil && ms.target != ms.src {
			ms.target.stop()
		}
		if t.Failed() || *flagKeep {
			t.Logf("logs and data kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	must(t, err, "kube-apiserver on etcd")
	ensureNamespace(t, ms.c, faultNS)
	ms.w = startWorkload(t, ms.c)
	ms.leases = startLeaseInformer(t, ms.w, watchClient(t, ms.c))
	return ms
}

// stopWriter pauses the workload's writers and cuts etcd's only other
// writer, kube-apiserver, off (by stopping it, or its etcd address), then
// returns etcd's revision: nothing changes it from here on.
func (ms *mirrorStack) stopWriter(t *testing.T, mode string) int64 {
	ms.w.stopWrites()
	ms.w.downtime.Store(true)
	if mode == cutAddress {
		ms.proxy.point("")
	} else {
		ms.c.apiserver.stop(syscall.SIGTERM)
	}
	resp, err := ms.src.client.Get(ctxT(t, time.Minute), "/health")
	must(t, err, "etcd's revision")
	return resp.Header.Revision
}

// switchStorage gives kube-apiserver its storage after the mirror stopped:
// fdb-etcd on the mirrored store (etcd stopped first, so that nothing can
// reach it), or etcd again for restart-etcd.
func (ms *mirrorStack) switchStorage(t *testing.T, mode string) {
	ms.target = ms.src
	if mode != cutRestartEtcd {
		ms.stopSrc.Do(ms.src.stop)
		var err error
		ms.target, err = startFDBEtcd(filepath.Join(ms.dir, "fdb"))
		must(t, err, "fdb-etcd on the mirrored store")
	}
	switch mode {
	case cutAddress:
		ms.proxy.point(ms.target.urls[0])
		ms.c.store = ms.target
		must(t, ms.c.waitReady(t), "kube-apiserver on %s", ms.target.name)
	case cutRestart:
		ms.startAPIServerOn(t, ms.target.urls[0])
	default:
		ms.startAPIServerOn(t, ms.proxy.url())
	}
}

// startAPIServerOn starts kube-apiserver again with its flags, but
// --etcd-servers=url.
func (ms *mirrorStack) startAPIServerOn(t *testing.T, url string) {
	c := ms.c
	i := slices.IndexFunc(c.args, func(a string) bool { return strings.HasPrefix(a, "--etcd-servers=") })
	c.args = slices.Clone(c.args)
	c.args[i] = "--etcd-servers=" + url
	c.store = ms.target
	must(t, c.startAPIServer(t), "kube-apiserver on %s", ms.target.name)
}

func startMirror(t *testing.T, bin, dir, from string) *mirrorProc {
	port, err := fdbetcd.FreePort()
	must(t, err, "metrics port")
	m := &mirrorProc{metricsURL: fmt.Sprintf("http://127.0.0.1:%d", port)}
	args := []string{"mirror", "--from", from, "--data-dir", filepath.Join(dir, "fdb", "fdb-etcd.data"),
		"--listen-metrics-urls", m.metricsURL}
	must(t, os.MkdirAll(filepath.Join(dir, "fdb"), 0o755), "mirror dir")
	m.p, err = startProc("fdb-etcd mirror", bin, args, nil, filepath.Join(dir, "mirror.log"))
	must(t, err, "starting the mirror")
	return m
}

// metric reads one of the mirror's gauges.
func (m *mirrorProc) metric(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.metricsURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if !regexp.MustCompile(`(?m)^` + name + ` `).Match(b) {
		return 0, fmt.Errorf("no %s yet", name)
	}
	return metricSum(string(b), name), nil
}

// waitLag waits until the mirror has loaded the snapshot and follows the
// etcd within most revisions.
func (m *mirrorProc) waitLag(t *testing.T, d time.Duration, most float64) error {
	ctx := ctxT(t, d)
	for {
		if m.p.exited() {
			return fmt.Errorf("the mirror exited: %v\n%s", m.p.err, tail(m.p.log(), 3000))
		}
		rev, err := m.metric(ctx, "fdb_etcd_mirror_revision")
		lag, lerr := m.metric(ctx, "fdb_etcd_mirror_lag_revisions")
		if err == nil && lerr == nil && rev > 0 && lag <= most {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("revision %v, lag %v: %v %v", rev, lag, err, lerr)
		case <-time.After(mirrorSample):
		}
	}
}

// waitRevision waits until the mirror has written revision rev with no lag.
func (m *mirrorProc) waitRevision(t *testing.T, d time.Duration, rev int64) error {
	ctx := ctxT(t, d)
	for {
		got, err := m.metric(ctx, "fdb_etcd_mirror_revision")
		lag, lerr := m.metric(ctx, "fdb_etcd_mirror_lag_revisions")
		if err == nil && lerr == nil && int64(got) >= rev && lag == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("at revision %v, lag %v: %v %v", got, lag, err, lerr)
		case <-time.After(mirrorSample):
		}
	}
}

// sampleLag samples the lag gauge for d and says its p50, p99 and maximum
// in revisions.
func (m *mirrorProc) sampleLag(t *testing.T, d time.Duration) string {
	var samples []float64
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(mirrorSample) {
		lag, err := m.metric(ctxT(t, 10*time.Second), "fdb_etcd_mirror_lag_revisions")
		must(t, err, "the mirror's lag")
		samples = append(samples, lag)
	}
	slices.Sort(samples)
	q := func(p float64) float64 { return samples[int(p*float64(len(samples)-1))] }
	return fmt.Sprintf("%d samples of fdb_etcd_mirror_lag_revisions: p50 %.0f, p99 %.0f, max %.0f revisions",
		len(samples), q(0.5), q(0.99), samples[len(samples)-1])
}

var applyLag = regexp.MustCompile(`apply-lag-(p50|p99)"?[:=]\s*"?([0-9.]+[a-zµ]*s)`)

// stop ends the mirror as the cut-over does (SIGTERM), checks that it
// published the store, and returns the apply lag's p50 and p99 it logged.
func (m *mirrorProc) stop(t *testing.T) (p50, p99 string) {
	m.p.stop(syscall.SIGTERM)
	log := m.p.log()
	if m.p.err != nil || !regexp.MustCompile(`mirror stopped and published`).MatchString(log) {
		t.Fatalf("the mirror did not stop cleanly (%v):\n%s", m.p.err, tail(log, 3000))
	}
	for _, g := range applyLag.FindAllStringSubmatch(log, -1) {
		if g[1] == "p50" {
			p50 = g[2]
		} else {
			p99 = g[2]
		}
	}
	return p50, p99
}

// checkMirrorState checks what the cut-over must keep: the first write on
// fdb-etcd comes after the last on etcd and after the mirrored revision,
// every object holds its last acknowledged write in a consistent LIST and
// in the informer, and an Exact LIST at the last resourceVersion etcd
// gave is served from the mirrored history.
func checkMirrorState(t *testing.T, c *cluster, w *workload, lastBefore string, rev int64, resumed time.Time) {
	ctx := ctxT(t, time.Minute)
	w.mu.Lock()
	defer w.mu.Unlock()
	if first := w.firstAckAfter(resumed); first == nil || !rvLess(strconv.FormatInt(rev, 10), first.rv) {
		t.Errorf("first write on fdb-etcd %+v, last on etcd at %s, etcd at %d: resourceVersions did not continue", first, lastBefore, rev)
	}
	l, err := c.client.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{})
	must(t, err, "consistent LIST on fdb-etcd")
	inList := map[string]corev1.ConfigMap{}
	for _, cm := range l.Items {
		inList[cm.Name] = cm
	}
	inCache := map[string]*corev1.ConfigMap{}
	for _, o := range w.inf.GetStore().List() {
		inCache[o.(*corev1.ConfigMap).Name] = o.(*corev1.ConfigMap)
	}
	names := map[string]bool{}
	for _, a := range w.acks {
		names[a.name] = true
	}
	for n := range names {
		a := w.lastAck(n)
		if cm, ok := inList[n]; !ok || cm.ResourceVersion != a.rv || cm.Data["v"] != a.v {
			t.Errorf("%s: LIST has %v %v, last acknowledged write %s=%s", n, cm.ResourceVersion, cm.Data, a.rv, a.v)
		}
		if cm := inCache[n]; cm == nil || cm.ResourceVersion != a.rv || cm.Data["v"] != a.v {
			t.Errorf("%s: informer has %v, last acknowledged write %s=%s", n, cm, a.rv, a.v)
		}
	}
	old, err := c.client.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{ResourceVersion: lastBefore, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	must(t, err, "Exact LIST at %s, a resourceVersion from etcd", lastBefore)
	t.Logf("%d ConfigMaps checked in a LIST (at %s) and the informer; an Exact LIST at etcd's %s has %d; %d consistent LISTs in all",
		len(names), l.ResourceVersion, lastBefore, len(old.Items), w.lists)
}

// firstAckAfter is the first write acknowledged after since. The caller
// holds w.mu.
func (w *workload) firstAckAfter(since time.Time) *ack {
	for i := range w.acks {
		if w.acks[i].at.After(since) {
			return &w.acks[i]
		}
	}
	return nil
}

func (w *workload) lastAckRV() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last string
	for _, a := range w.acks {
		if last == "" || rvLess(last, a.rv) {
			last = a.rv
		}
	}
	return last
}

// leaseInformer is an informer on kube-system's Leases (kube-apiserver's
// own, renewed every 10 s), counting its LISTs.
type leaseInformer struct {
	inf   cache.SharedIndexInformer
	lists atomic.Int64
}

func startLeaseInformer(t *testing.T, w *workload, cs kubernetes.Interface) *leaseInformer {
	li := &leaseInformer{}
	api := cs.CoordinationV1().Leases("kube-system")
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			li.lists.Add(1)
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				li.lists.Add(1)
			}
			return api.Watch(ctx, o)
		},
	}
	li.inf = cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
	w.wg.Add(1)
	go func() { defer w.wg.Done(); li.inf.RunWithContext(w.ctx) }()
	if !cache.WaitForCacheSync(ctxT(t, time.Minute).Done(), li.inf.HasSynced) {
		t.Fatal("lease informer did not sync")
	}
	return li
}

// check waits (a minute at most) until the informer holds what a
// consistent LIST holds, and checks that it listed once.
func (li *leaseInformer) check(t *testing.T, c *cluster) {
	var diff string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		l, err := c.client.CoordinationV1().Leases("kube-system").List(ctxT(t, time.Minute), metav1.ListOptions{})
		must(t, err, "LIST of Leases")
		diff = ""
		for _, want := range l.Items {
			o, ok, _ := li.inf.GetStore().GetByKey("kube-system/" + want.Name)
			if !ok || rvLess(o.(*coordinationv1.Lease).ResourceVersion, want.ResourceVersion) {
				diff = fmt.Sprintf("%s at %s in the LIST", want.Name, want.ResourceVersion)
			}
		}
		if diff == "" {
			break
		}
	}
	if diff != "" {
		t.Errorf("the Lease informer never caught up with the LIST: %s", diff)
	}
	if n := li.lists.Load(); n != 1 {
		t.Errorf("the Lease informer listed %d times: it relisted", n)
	}
	t.Logf("Lease informer: %d objects, %d LIST", len(li.inf.GetStore().List()), li.lists.Load())
}
