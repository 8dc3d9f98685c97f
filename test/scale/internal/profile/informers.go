package profile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// SentAnnotation holds, on a probe ConfigMap, the harness's clock (Unix
// nanoseconds) just before it sent the create.
const SentAnnotation = "scale.fdb-etcd.io/sent"

// informersPerConnection is how many informers share one client (one TCP
// connection): 200 informers come from ~20 clients, as from many kubelets
// and controllers, rather than one HTTP/2 connection.
const informersPerConnection = 10

func fieldsEverything() fields.Selector { return fields.Everything() }

// Mix is how the profile's informers divide between kinds.
type Mix struct {
	PodsByNode     int // pods with fieldSelector spec.nodeName (as kubelets)
	PodsAll        int // every pod (as controllers)
	EndpointSlices int // cluster-wide, with kube-proxy's label selector
	ConfigMaps     int // one namespace each
}

// InformerMix divides n informers: 14 % configmaps, 15 % endpointslices,
// 1 % (at least one) all pods, the rest pods by node.
func InformerMix(n int) Mix {
	m := Mix{ConfigMaps: n * 14 / 100, EndpointSlices: n * 15 / 100, PodsAll: max(1, n/100)}
	m.PodsByNode = max(0, n-m.ConfigMaps-m.EndpointSlices-m.PodsAll)
	return m
}

// informerSpec is one informer to start.
type informerSpec struct {
	resource, namespace string
	modify              func(*metav1.ListOptions)
	object              runtime.Object
	client              func(kubernetes.Interface) cache.Getter
}

func (r *Run) informerSpecs() []informerSpec {
	m := InformerMix(r.cfg.Informers)
	core := func(c kubernetes.Interface) cache.Getter { return c.CoreV1().RESTClient() }
	var specs []informerSpec
	for i := range m.PodsByNode {
		sel := fields.OneTermEqualSelector("spec.nodeName", r.nodes[i%len(r.nodes)]).String()
		specs = append(specs, informerSpec{"pods", metav1.NamespaceAll, func(o *metav1.ListOptions) { o.FieldSelector = sel }, &corev1.Pod{}, core})
	}
	for range m.PodsAll {
		specs = append(specs, informerSpec{"pods", metav1.NamespaceAll, func(*metav1.ListOptions) {}, &corev1.Pod{}, core})
	}
	for range m.EndpointSlices {
		specs = append(specs, informerSpec{"endpointslices", metav1.NamespaceAll,
			func(o *metav1.ListOptions) {
				o.LabelSelector = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
			}, &discoveryv1.EndpointSlice{},
			func(c kubernetes.Interface) cache.Getter { return c.DiscoveryV1().RESTClient() }})
	}
	for i := range m.ConfigMaps {
		specs = append(specs, informerSpec{"configmaps", appNamespace(i % r.cfg.Namespaces), func(*metav1.ListOptions) {}, &corev1.ConfigMap{}, core})
	}
	return specs
}

// StartInformers starts the profile's informers and waits until every one
// has synced.
func (r *Run) StartInformers(ctx context.Context) error {
	specs := r.informerSpecs()
	var synced []cache.InformerSynced
	var cs kubernetes.Interface
	for i, s := range specs {
		if i%informersPerConnection == 0 {
			cfg := r.clients(100)
			// A Dial of its own keeps client-go from sharing the cached
			// transport (and so one connection) between clients.
			cfg.Dial = (&net.Dialer{}).DialContext
			var err error
			if cs, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
		}
		inf := cache.NewSharedIndexInformer(cache.NewFilteredListWatchFromClient(s.client(cs), s.resource, s.namespace, s.modify), s.object, 0, cache.Indexers{})
		name := s.resource + "#" + strconv.Itoa(i)
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				r.errs.add("informer "+name, err, true)
			}
		}); err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(r.handler(s.resource)); err != nil {
			return err
		}
		r.wg.Go(func() { inf.Run(r.life.Done()) })
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("%d informers not synced: %w", len(specs), ctx.Err())
	}
	return nil
}

// handler counts events after the initial list and times the ones the
// harness caused: a probe ConfigMap's creation, a churned pod's deletion.
func (r *Run) handler(resource string) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				return
			}
			r.c.informerEvents.Add(1)
			if cm, ok := obj.(*corev1.ConfigMap); ok && resource == "configmaps" {
				if ns, err := strconv.ParseInt(cm.Annotations[SentAnnotation], 10, 64); err == nil {
					r.probeLat.Record(r.now().Sub(timeFromNanos(ns)))
				}
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			r.c.informerEvents.Add(1)
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if ok1 && ok2 && o.DeletionTimestamp == nil && n.DeletionTimestamp != nil {
				r.podDeleteSeen(n)
			}
		},
		// The churn deletes bound pods, which go through a graceful update
		// (deletionTimestamp) before kwok removes them: that update is what
		// is timed, the removal only counted.
		DeleteFunc: func(any) { r.c.informerEvents.Add(1) },
	}
}

// podDeleteSeen times an informer's sight of a pod the churn deleted.
func (r *Run) podDeleteSeen(p *corev1.Pod) {
	r.pendingMu.Lock()
	sent, ok := r.pending[p.UID]
	r.pendingMu.Unlock()
	if ok {
		r.podDeleteLat.Record(r.now().Sub(sent))
	}
}
