package profile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/cluster"
)

// BulkNamespace is the namespace deleted, with its objects, during the
// measured phase.
const BulkNamespace = "scale-bulk"

// setupWorkers is how many creations run at once during set-up.
const setupWorkers = 16

func appNamespace(i int) string { return fmt.Sprintf("scale-app-%d", i) }

// Setup creates the nodes, waits until kwok has made them Ready, fills the
// bulk namespace, creates the Services and Deployments and waits until
// every pod runs.
func (r *Run) Setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SetupTimeout)
	defer cancel()
	start := r.now()
	r.startHarnessInformers()
	for i := range r.cfg.Namespaces {
		if err := r.createNamespace(ctx, appNamespace(i)); err != nil {
			return err
		}
	}
	if err := parallel(ctx, len(r.nodes), func(i int) error { return r.createNode(ctx, r.nodes[i]) }); err != nil {
		return fmt.Errorf("creating nodes: %w", err)
	}
	if err := r.waitNodesReady(ctx); err != nil {
		return err
	}
	r.logf("%d nodes Ready after %v", len(r.nodes), r.now().Sub(start).Round(time.Second))
	if err := r.fillBulk(ctx); err != nil {
		return err
	}
	deps := r.deployments()
	if err := parallel(ctx, len(deps), func(i int) error { return r.createApp(ctx, deps[i]) }); err != nil {
		return fmt.Errorf("creating deployments: %w", err)
	}
	if err := r.waitPodsRunning(ctx, r.cfg.Pods); err != nil {
		return err
	}
	r.logf("%d pods Running after %v", r.cfg.Pods, r.now().Sub(start).Round(time.Second))
	return nil
}

// parallel runs f(0..n-1) on setupWorkers goroutines; the first error
// stops the rest.
func parallel(ctx context.Context, n int, f func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(setupWorkers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

func (r *Run) createNamespace(ctx context.Context, name string) error {
	_, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

func (r *Run) createNode(ctx context.Context, name string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{"type": "kwok", corev1.LabelHostname: name},
		Annotations: map[string]string{cluster.NodeAnnotation: "fake"},
	}}
	_, err := r.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	return err
}

// poll calls done every interval until it says true or ctx ends.
func poll(ctx context.Context, interval time.Duration, what string, done func() (bool, string)) error {
	for {
		ok, state := done()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (%s)", what, ctx.Err(), state)
		case <-time.After(interval):
		}
	}
}

func (r *Run) waitNodesReady(ctx context.Context) error {
	return poll(ctx, 2*time.Second, "nodes Ready", func() (bool, string) {
		list, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for i := range list.Items {
			if nodeReady(&list.Items[i]) {
				ready++
			}
		}
		return ready >= len(r.nodes), fmt.Sprintf("%d of %d Ready", ready, len(r.nodes))
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (r *Run) waitPodsRunning(ctx context.Context, want int) error {
	return poll(ctx, 2*time.Second, "pods Running", func() (bool, string) {
		n := r.runningPods()
		return n >= want, fmt.Sprintf("%d of %d Running", n, want)
	})
}

// fillBulk creates the bulk namespace's objects: half ConfigMaps, half
// Secrets, ~1 KiB each.
func (r *Run) fillBulk(ctx context.Context) error {
	if r.cfg.BulkObjects == 0 {
		return nil
	}
	if err := r.createNamespace(ctx, BulkNamespace); err != nil {
		return err
	}
	payload := strings.Repeat("x", 1024)
	err := parallel(ctx, r.cfg.BulkObjects, func(i int) error {
		meta := metav1.ObjectMeta{Name: fmt.Sprintf("bulk-%d", i), Namespace: BulkNamespace}
		var err error
		if i%2 == 0 {
			_, err = r.cs.CoreV1().ConfigMaps(BulkNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"d": payload}}, metav1.CreateOptions{})
		} else {
			_, err = r.cs.CoreV1().Secrets(BulkNamespace).Create(ctx, &corev1.Secret{ObjectMeta: meta, StringData: map[string]string{"d": payload}}, metav1.CreateOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("filling %s: %w", BulkNamespace, err)
	}
	return nil
}

// app is one Deployment and its Service.
type app struct {
	namespace, name string
	replicas        int32
}

func (r *Run) deployments() []app {
	var out []app
	for left, i := r.cfg.Pods, 0; left > 0; i++ {
		n := min(left, r.cfg.PodsPerDeployment)
		out = append(out, app{namespace: appNamespace(i % r.cfg.Namespaces), name: fmt.Sprintf("app-%d", i), replicas: int32(n)})
		left -= n
	}
	return out
}

func (r *Run) createApp(ctx context.Context, a app) error {
	labels := map[string]string{"app": a.name}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: a.name, Namespace: a.namespace},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := r.cs.CoreV1().Services(a.namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	no := false
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: a.name, Namespace: a.namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &a.replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken: &no,
					NodeSelector:                 map[string]string{"type": "kwok"},
					Containers: []corev1.Container{{
						Name:  "app",
						Image: "registry.example/app:1",
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU:    resource.MustParse("10m"),
							corev1.ResourceMemory: resource.MustParse("16Mi"),
						}},
					}},
				},
			},
		},
	}
	_, err := r.cs.AppsV1().Deployments(a.namespace).Create(ctx, dep, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// startHarnessInformers starts the cluster-wide pod informer the churn
// picks from and a node informer that counts nodes going NotReady (a lease
// or status the store did not keep up with); neither is one of the
// profile's informers.
func (r *Run) startHarnessInformers() {
	lw := cache.NewListWatchFromClient(r.cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fieldsEverything())
	r.allPods = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	nodes := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(r.cs.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fieldsEverything()),
		&corev1.Node{}, 0, cache.Indexers{})
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
		o, ok1 := oldObj.(*corev1.Node)
		n, ok2 := newObj.(*corev1.Node)
		if ok1 && ok2 && nodeReady(o) && !nodeReady(n) {
			r.c.notReady.Add(1)
		}
	}})
	for _, inf := range []cache.SharedIndexInformer{r.allPods, nodes} {
		r.wg.Go(func() { inf.Run(r.life.Done()) })
	}
}
