package scenarios

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

const (
	faultNS      = "faults"
	faultWriters = 2
	faultObjects = 10                     // ConfigMaps per writer
	faultPacing  = 50 * time.Millisecond  // between one writer's writes
	faultListGap = 200 * time.Millisecond // between consistent LISTs
	faultTimeout = 15 * time.Second       // one request's deadline
)

// ack is a write the apiserver acknowledged.
type ack struct {
	name, rv, v string
	at          time.Time
}

// failure is a write the apiserver did not acknowledge.
type failure struct {
	reason string
	at     time.Time
}

// event is what the watch delivered.
type event struct {
	typ         watch.EventType
	name, rv, v string
}

// workload drives the apiserver and records what it answered. mu guards
// everything below it; the counters are atomic.
type workload struct {
	ctx                  context.Context // the watch's and the informer's
	cancelWrites, cancel context.CancelFunc
	writes, wg           sync.WaitGroup // the writers and the lister; the watch and the informer
	inf                  cache.SharedIndexInformer

	infLists atomic.Int64 // LISTs (and initial-events watches) the informer made
	// downtime is set while the apiserver is stopped on purpose (a
	// cut-over): watch errors then are expected, except an expired
	// resourceVersion, which would make a reflector relist.
	downtime atomic.Bool

	mu        sync.Mutex
	lists     int64 // consistent LISTs answered
	acks      []ack
	failures  []failure
	events    []event
	watchRV   string   // the last resourceVersion the watch saw
	streams   int      // watch requests opened
	anomalies []string // errors that end a watch, backward resourceVersions, ...
}

// watchClient is a clientset on a connection of its own for the watch and
// the informer, so that what the writers' requests meet cannot end their
// streams. (client-go shares one transport between configurations whose TLS
// and dialing settings are equal; DisableCompression sets this one apart.)
func watchClient(t *testing.T, c *cluster) kubernetes.Interface {
	cfg := rest.CopyConfig(c.cfg)
	cfg.DisableCompression = true
	cs, err := kubernetes.NewForConfig(cfg)
	must(t, err, "watch client")
	return cs
}

func startWorkload(t *testing.T, c *cluster) *workload {
	ctx, cancel := context.WithCancel(context.Background())
	wctx, cancelWrites := context.WithCancel(ctx)
	w := &workload{ctx: ctx, cancel: cancel, cancelWrites: cancelWrites}
	l, err := c.client.CoreV1().ConfigMaps(faultNS).List(ctxT(t, time.Minute), metav1.ListOptions{})
	must(t, err, "first list")
	w.watchRV = l.ResourceVersion
	wc := watchClient(t, c)
	w.startInformer(t, ctx, wc)
	for id := 0; id < faultWriters; id++ {
		w.writes.Add(1)
		go func() { defer w.writes.Done(); w.write(wctx, c, id, faultObjects, 0) }()
	}
	w.writes.Add(1)
	go func() { defer w.writes.Done(); w.list(wctx, c) }()
	w.wg.Add(1)
	go func() { defer w.wg.Done(); w.watch(ctx, wc) }()
	t.Cleanup(w.stop)
	return w
}

// stopWrites ends the writers and the lister; the watch and the informer
// go on.
func (w *workload) stopWrites() {
	w.cancelWrites()
	w.writes.Wait()
}

// resumeWrites starts the writers and the lister again after stopWrites:
// generation gen (part of every value, so that each write's value is its
// own) over objects ConfigMaps per writer, the first ones updated, any more
// created.
func (w *workload) resumeWrites(c *cluster, objects, gen int) {
	wctx, cancelWrites := context.WithCancel(w.ctx)
	w.cancelWrites = cancelWrites
	for id := 0; id < faultWriters; id++ {
		w.writes.Add(1)
		go func() { defer w.writes.Done(); w.write(wctx, c, id, objects, gen) }()
	}
	w.writes.Add(1)
	go func() { defer w.writes.Done(); w.list(wctx, c) }()
}

func (w *workload) stop() {
	w.stopWrites()
	w.cancel()
	w.wg.Wait()
}

func (w *workload) anomaly(format string, args ...any) {
	w.mu.Lock()
	w.anomalies = append(w.anomalies, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// write creates, then updates, its writer's ConfigMaps in turn.
func (w *workload) write(ctx context.Context, c *cluster, id, objects, gen int) {
	created := map[string]bool{}
	tick := time.NewTicker(faultPacing)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		name, v := fmt.Sprintf("w%d-%d", id, i%objects), fmt.Sprintf("%d-%d", id, i)
		if gen > 0 {
			v = fmt.Sprintf("g%d-%s", gen, v)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": v}}
		// Not under ctx: stopping the workload lets a write in flight end,
		// so that every write's outcome is known.
		rctx, cancel := context.WithTimeout(context.Background(), faultTimeout)
		var got *corev1.ConfigMap
		var err error
		if !created[name] {
			got, err = c.client.CoreV1().ConfigMaps(faultNS).Create(rctx, cm, metav1.CreateOptions{})
		}
		if created[name] || apierrors.IsAlreadyExists(err) {
			got, err = c.client.CoreV1().ConfigMaps(faultNS).Update(rctx, cm, metav1.UpdateOptions{})
		}
		cancel()
		w.mu.Lock()
		switch {
		case err == nil:
			created[name] = true
			w.acks = append(w.acks, ack{name: name, rv: got.ResourceVersion, v: v, at: time.Now()})
		default:
			w.failures = append(w.failures, failure{reason: reason(err), at: time.Now()})
		}
		w.mu.Unlock()
	}
}

// reason names an error by its HTTP status, reason and message (cut
// short), or its text.
func reason(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		msg := s.Message
		if len(msg) > 120 {
			msg = msg[:120] + "..."
		}
		return fmt.Sprintf("%d %s %q", s.Code, s.Reason, msg)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "client timeout"
	}
	return err.Error()
}

// list makes consistent LISTs; their resourceVersions must never go back.
func (w *workload) list(ctx context.Context, c *cluster) {
	var last uint64
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, faultTimeout)
		l, err := c.client.CoreV1().ConfigMaps(faultNS).List(rctx, metav1.ListOptions{})
		cancel()
		if err == nil {
			rv, perr := strconv.ParseUint(l.ResourceVersion, 10, 64)
			if perr != nil || rv < last {
				w.anomaly("consistent LIST at resourceVersion %s after one at %d", l.ResourceVersion, last)
			}
			last = max(last, rv)
			w.mu.Lock()
			w.lists++
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(faultListGap):
		}
	}
}

// watch follows the namespace's ConfigMaps from the first LIST on, as a
// reflector does: a watch that ends is opened again from the last
// resourceVersion seen; one that ends with an error event would make a
// reflector relist, so that is recorded, and the watch relists too.
func (w *workload) watch(ctx context.Context, cs kubernetes.Interface) {
	for ctx.Err() == nil {
		w.mu.Lock()
		rv := w.watchRV
		w.mu.Unlock()
		wi, err := cs.CoreV1().ConfigMaps(faultNS).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		w.mu.Lock()
		w.streams++
		w.mu.Unlock()
		if err != nil {
			expired := apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
			if ctx.Err() == nil {
				if expired || !w.downtime.Load() {
					w.anomaly("opening a watch at %s: %v", rv, err)
				}
				w.relistWatch(ctx, cs, expired)
				time.Sleep(faultListGap)
			}
			continue
		}
		w.relistWatch(ctx, cs, w.drain(ctx, wi))
	}
}

// drain records a watch's events until it ends, and reports whether it
// ended with an error event.
func (w *workload) drain(ctx context.Context, wi watch.Interface) bool {
	defer wi.Stop()
	for ev := range wi.ResultChan() {
		if ev.Type == watch.Error {
			if ctx.Err() != nil {
				return false // the workload's end
			}
			err := apierrors.FromObject(ev.Object)
			if w.downtime.Load() && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
				return false // the apiserver going down: watch again from the last resourceVersion
			}
			w.anomaly("watch error event: %v", err)
			return true
		}
		cm, ok := ev.Object.(*corev1.ConfigMap)
		if !ok {
			w.anomaly("watch event %s of %T", ev.Type, ev.Object)
			continue
		}
		w.mu.Lock()
		if ev.Type != watch.Bookmark {
			w.events = append(w.events, event{typ: ev.Type, name: cm.Name, rv: cm.ResourceVersion, v: cm.Data["v"]})
		}
		w.watchRV = cm.ResourceVersion
		w.mu.Unlock()
	}
	return false
}

// relistWatch starts the watch again from a fresh LIST when it must.
func (w *workload) relistWatch(ctx context.Context, cs kubernetes.Interface, must bool) {
	if !must || ctx.Err() != nil {
		return
	}
	l, err := cs.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	w.anomaly("watch relisted at %s", l.ResourceVersion)
	w.mu.Lock()
	w.watchRV = l.ResourceVersion
	w.mu.Unlock()
}

// startInformer runs a client-go informer on the namespace's ConfigMaps,
// counting its LISTs: more than the first one is a relist.
func (w *workload) startInformer(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	cms := cs.CoreV1().ConfigMaps(faultNS)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			w.infLists.Add(1)
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				w.infLists.Add(1)
			}
			return cms.Watch(ctx, o)
		},
	}
	w.inf = cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	must(t, w.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		expired := apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
		if !errors.Is(err, context.Canceled) && ctx.Err() == nil && (expired || !w.downtime.Load()) {
			w.anomaly("informer watch error: %v", err)
		}
	}), "watch error handler")
	_, err := w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(o, n any) {
		if rvLess(n.(*corev1.ConfigMap).ResourceVersion, o.(*corev1.ConfigMap).ResourceVersion) {
			w.anomaly("informer update of %s went back from %s to %s", n.(*corev1.ConfigMap).Name,
				o.(*corev1.ConfigMap).ResourceVersion, n.(*corev1.ConfigMap).ResourceVersion)
		}
	}})
	must(t, err, "informer handler")
	w.wg.Add(1)
	go func() { defer w.wg.Done(); w.inf.RunWithContext(ctx) }()
	if !cache.WaitForCacheSync(ctxT(t, time.Minute).Done(), w.inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
}

func rvLess(a, b string) bool {
	x, _ := strconv.ParseUint(a, 10, 64)
	y, _ := strconv.ParseUint(b, 10, 64)
	return x < y
}

// waitWrite waits until a write acknowledged after since.
func (w *workload) waitWrite(since time.Time, d time.Duration) error {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		w.mu.Lock()
		n := len(w.acks)
		ok := n > 0 && w.acks[n-1].at.After(since)
		w.mu.Unlock()
		if ok {
			return nil
		}
	}
	return fmt.Errorf("no write acknowledged within %v", d)
}

// longestGap is the longest time in [from, to] without an acknowledged
// write.
func (w *workload) longestGap(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var at []time.Time
	for _, a := range w.acks {
		at = append(at, a.at)
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	var longest time.Duration
	prev := from
	for _, a := range at {
		if a.Before(from) {
			continue
		}
		if a.After(to) {
			break
		}
		longest = max(longest, a.Sub(prev))
		prev = a
	}
	return max(longest, to.Sub(prev))
}

// errorsBetween counts the failed writes in [from, to] by reason.
func (w *workload) errorsBetween(from, to time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := map[string]int{}
	for _, f := range w.failures {
		if !f.at.Before(from) && !f.at.After(to) {
			n[f.reason]++
		}
	}
	var out []string
	for r, k := range n {
		out = append(out, fmt.Sprintf("%s: %d", r, k))
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// verify stops the writes, waits until the watch and the informer have
// caught up with a final consistent LIST, and checks what they saw.
func (w *workload) verify(t *testing.T, c *cluster, diagnose func(finalRV string)) {
	w.stopWrites()
	ctx := ctxT(t, 2*time.Minute)
	final, err := c.client.CoreV1().ConfigMaps(faultNS).List(ctx, metav1.ListOptions{})
	must(t, err, "final list")
	want := map[string]string{}
	for _, cm := range final.Items {
		want[cm.Name] = cm.ResourceVersion
	}
	flushes, ok := w.catchUp(t, ctx, c, want)
	w.stop()
	t.Logf("the watch and the informer had the final state after %d writes of the flush ConfigMap", flushes)
	if !ok {
		t.Errorf("the watch (%d streams, last event at %s, last resourceVersion %s) or the informer (last sync at %s) did not reach the final list at %s",
			w.streams, w.lastEventRV(), w.watchRV, w.inf.LastSyncResourceVersion(), final.ResourceVersion)
		diagnose(final.ResourceVersion)
	}
	w.checkWatch(t)
	for _, cm := range final.Items {
		if last := w.lastAck(cm.Name); last != nil && rvLess(cm.ResourceVersion, last.rv) {
			t.Errorf("%s is at resourceVersion %s, older than the acknowledged write at %s", cm.Name, cm.ResourceVersion, last.rv)
		}
	}
	if n := w.infLists.Load(); n != 1 {
		t.Errorf("the informer listed %d times: it relisted", n)
	}
	for _, a := range w.anomalies {
		t.Errorf("%s", a)
	}
	t.Logf("%d acknowledged writes, %d failed, %d watch events, %d consistent LISTs, informer lists %d", len(w.acks), len(w.failures), len(w.events), w.lists, w.infLists.Load())
}

// catchUp waits up to a minute until the watch and the informer hold every
// object of want at its resourceVersion, writing a ConfigMap outside the
// workload meanwhile, so that a watch whose last events are held back
// somewhere gets them pushed out; it returns how many writes that took.
func (w *workload) catchUp(t *testing.T, ctx context.Context, c *cluster, want map[string]string) (int, bool) {
	flushes := 0
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); flushes++ {
		if w.caught(want) {
			return flushes, true
		}
		flush := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flush"}, Data: map[string]string{"i": strconv.Itoa(flushes)}}
		_, err := c.client.CoreV1().ConfigMaps(faultNS).Update(ctx, flush, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			_, err = c.client.CoreV1().ConfigMaps(faultNS).Create(ctx, flush, metav1.CreateOptions{})
		}
		must(t, err, "write the flush ConfigMap")
		time.Sleep(500 * time.Millisecond)
	}
	return flushes, w.caught(want)
}

// caught reports whether the informer and the watch hold every object of
// want at its resourceVersion.
func (w *workload) caught(want map[string]string) bool {
	got := map[string]string{}
	for _, o := range w.inf.GetStore().List() {
		got[o.(*corev1.ConfigMap).Name] = o.(*corev1.ConfigMap).ResourceVersion
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.events {
		got["watch/"+e.name] = e.rv
	}
	for n, rv := range want {
		if got[n] != rv || got["watch/"+n] != rv {
			return false
		}
	}
	return true
}

// checkWatch checks that the watch's events came in resourceVersion order,
// each once, and that every acknowledged write is among them with its
// resourceVersion and value.
func (w *workload) checkWatch(t *testing.T) {
	byRV := map[string]event{}
	for i, e := range w.events {
		if i > 0 && !rvLess(w.events[i-1].rv, e.rv) {
			t.Errorf("watch event %d (%s %s at %s) after one at %s", i, e.typ, e.name, e.rv, w.events[i-1].rv)
		}
		byRV[e.rv] = e
	}
	missing := 0
	for _, a := range w.acks {
		e, ok := byRV[a.rv]
		if ok && e.name == a.name && e.v == a.v {
			continue
		}
		if missing++; missing <= 5 {
			t.Errorf("acknowledged write of %s=%s at resourceVersion %s (%s): the watch delivered %+v", a.name, a.v, a.rv, a.at.Format("15:04:05.000"), e)
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged writes are not in the watch", missing, len(w.acks))
	}
}

func (w *workload) lastAck(name string) *ack {
	for i := len(w.acks) - 1; i >= 0; i-- {
		if w.acks[i].name == name {
			return &w.acks[i]
		}
	}
	return nil
}

func (w *workload) lastEventRV() string {
	if len(w.events) == 0 {
		return "-"
	}
	return w.events[len(w.events)-1].rv
}
