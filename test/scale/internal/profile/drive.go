package profile

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// opTimeout bounds one request of the drive loops.
	opTimeout = 60 * time.Second
	// maxInFlight bounds each loop's concurrent requests: a tick that finds
	// them all busy is skipped and counted, which shows a store (or this
	// machine) not keeping up instead of piling up goroutines.
	maxInFlight = 64
	// probesKept is how many probe ConfigMaps each namespace keeps: older
	// ones are deleted as new ones are created.
	probesKept = 20
	// pendingTTL is how long a churned pod's deletion time is kept for
	// informers to report it.
	pendingTTL = 2 * time.Minute
)

func timeFromNanos(ns int64) time.Time { return time.Unix(0, ns) }

// Drive runs the measured phase for cfg.Duration: the churn, the probes,
// the reads and the full LISTs at their rates, and the bulk namespace's
// deletion at its moment (which may outlast the phase: WaitBulk).
func (r *Run) Drive(ctx context.Context) Summary {
	phase, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()
	r.bulkDone = make(chan time.Duration, 1)
	r.wg.Go(func() { r.deleteBulk(ctx, phase) })
	var wg sync.WaitGroup
	wg.Go(func() { paced(phase, r.cfg.ChurnRate, &r.c.churned, &r.c.churnSkipped, r.churnOne(r.rng(1))) })
	wg.Go(func() { paced(phase, r.cfg.ProbeRate, &r.c.probes, &r.c.probesSkipped, r.probeOne()) })
	wg.Go(func() { paced(phase, r.cfg.ReadRate, &r.c.reads, &r.c.readsSkipped, r.readOne(r.rng(2))) })
	wg.Go(func() { r.fullLists(phase) })
	wg.Wait()
	s := r.summary()
	select {
	case d := <-r.bulkDone:
		s.BulkDeleted, s.BulkDeleteTook = true, d
		r.bulkDone <- d
	default:
	}
	return s
}

// paced calls op rate times a second until ctx ends, at most maxInFlight
// at once, and waits for the calls in flight. Each call gets its own
// timeout rather than ctx, so the phase's end does not fail the requests
// in flight.
func paced(ctx context.Context, rate float64, done, skipped *atomic.Int64, op func(context.Context)) {
	if rate <= 0 {
		return
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case sem <- struct{}{}:
		default:
			skipped.Add(1)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			defer cancel()
			op(octx)
			done.Add(1)
		})
	}
}

// pickPod returns a running pod that is not being deleted, or nil.
func (r *Run) pickPod(rng *rand.Rand) *corev1.Pod {
	keys := r.allPods.GetStore().ListKeys()
	for range 20 {
		if len(keys) == 0 {
			return nil
		}
		o, ok, _ := r.allPods.GetStore().GetByKey(keys[rng.Intn(len(keys))])
		if p, isPod := o.(*corev1.Pod); ok && isPod && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p
		}
	}
	return nil
}

// churnOne deletes one running pod (its ReplicaSet creates another) and
// notes when, for the informers to time the deletion's delivery.
func (r *Run) churnOne(rng *rand.Rand) func(context.Context) {
	var mu sync.Mutex // rng is not safe for concurrent use
	return func(ctx context.Context) {
		mu.Lock()
		p := r.pickPod(rng)
		mu.Unlock()
		if p == nil {
			return
		}
		now := r.now()
		r.pendingMu.Lock()
		r.pending[p.UID] = now
		for uid, t := range r.pending {
			if now.Sub(t) > pendingTTL {
				delete(r.pending, uid)
			}
		}
		r.pendingMu.Unlock()
		uid := p.UID
		err := r.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.errs.add("churn delete", err, false)
		}
	}
}

// probeOne creates a ConfigMap stamped with the time of sending (the
// configmap informers time its delivery) and deletes the namespace's
// oldest probe beyond probesKept.
func (r *Run) probeOne() func(context.Context) {
	var seq atomic.Int64
	return func(ctx context.Context) {
		n := seq.Add(1) - 1
		ns := appNamespace(int(n % int64(r.cfg.Namespaces)))
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name:        "probe-" + strconv.FormatInt(n, 10),
			Annotations: map[string]string{SentAnnotation: strconv.FormatInt(r.now().UnixNano(), 10)},
		}, Data: map[string]string{"seq": strconv.FormatInt(n, 10)}}
		if _, err := r.cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			r.errs.add("probe create", err, false)
		}
		if old := n - probesKept*int64(r.cfg.Namespaces); old >= 0 {
			err := r.cs.CoreV1().ConfigMaps(ns).Delete(ctx, "probe-"+strconv.FormatInt(old, 10), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				r.errs.add("probe delete", err, false)
			}
		}
	}
}

// readOne is, in turn, a GET of a pod, a LIST of one namespace's pods and
// a LIST of one namespace's ConfigMaps (consistent reads, unpaginated).
func (r *Run) readOne(rng *rand.Rand) func(context.Context) {
	var mu sync.Mutex
	var turn int
	return func(ctx context.Context) {
		mu.Lock()
		kind := turn % 3
		turn++
		ns := appNamespace(rng.Intn(r.cfg.Namespaces))
		var p *corev1.Pod
		if kind == 0 {
			p = r.pickPod(rng)
		}
		mu.Unlock()
		var err error
		switch {
		case kind == 0 && p != nil:
			_, err = r.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				err = nil // churned meanwhile
			}
		case kind == 1:
			_, err = r.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		case kind == 2:
			_, err = r.cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			r.errs.add("read", err, false)
		}
	}
}

// fullLists lists every pod every ListInterval, unpaginated and then in
// pages of ListPageSize, both consistent reads.
func (r *Run) fullLists(ctx context.Context) {
	if r.cfg.ListInterval <= 0 {
		return
	}
	tick := time.NewTicker(r.cfg.ListInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*opTimeout)
		start := r.now()
		if _, err := r.cs.CoreV1().Pods(metav1.NamespaceAll).List(octx, metav1.ListOptions{}); err != nil {
			r.errs.add("full list", err, false)
		} else {
			r.fullList.Record(r.now().Sub(start))
		}
		start = r.now()
		if err := r.listPaged(octx); err != nil {
			r.errs.add("paged list", err, false)
		} else {
			r.pagedList.Record(r.now().Sub(start))
		}
		cancel()
		r.c.fullLists.Add(1)
	}
}

func (r *Run) listPaged(ctx context.Context) error {
	opts := metav1.ListOptions{Limit: r.cfg.ListPageSize}
	for {
		l, err := r.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return err
		}
		r.c.pages.Add(1)
		if l.Continue == "" {
			return nil
		}
		opts.Continue = l.Continue
	}
}

// deleteBulk deletes the bulk namespace at BulkDeleteAt of the phase and
// sends on bulkDone how long it took to disappear; it gives up when ctx
// (not the phase's) ends or the run is closed.
func (r *Run) deleteBulk(ctx, phase context.Context) {
	if r.cfg.BulkObjects == 0 {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.life, cancel)()
	select {
	case <-phase.Done():
		return
	case <-time.After(time.Duration(r.cfg.BulkDeleteAt * float64(r.cfg.Duration))):
	}
	start := r.now()
	if err := r.cs.CoreV1().Namespaces().Delete(ctx, BulkNamespace, metav1.DeleteOptions{}); err != nil {
		r.errs.add("bulk namespace delete", err, false)
		return
	}
	r.logf("deleting namespace %s (%d objects)", BulkNamespace, r.cfg.BulkObjects)
	err := poll(ctx, time.Second, "namespace "+BulkNamespace+" gone", func() (bool, string) {
		_, err := r.cs.CoreV1().Namespaces().Get(ctx, BulkNamespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if err != nil {
		r.logf("%v", err)
		return
	}
	r.bulkDone <- r.now().Sub(start)
}

// WaitBulk waits up to timeout for the bulk namespace's deletion (started
// by Drive) and says how long it took, or false if it had not ended.
func (r *Run) WaitBulk(timeout time.Duration) (time.Duration, bool) {
	if r.cfg.BulkObjects == 0 || r.bulkDone == nil {
		return 0, false
	}
	select {
	case d := <-r.bulkDone:
		r.bulkDone <- d
		return d, true
	case <-time.After(timeout):
		return 0, false
	}
}
