package scenarios

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// scenario is one end-to-end check against a running cluster.
type scenario struct {
	name string
	// reference: also run against kube-apiserver on the embedded etcd.
	reference bool
	run       func(t *testing.T, c *cluster)
}

func scenarios() []scenario {
	return []scenario{
		{name: "Health", reference: true, run: scenarioHealth},
		{name: "CRUD", run: scenarioCRUD},
		{name: "ServerSideApply", run: scenarioSSA},
		{name: "ResourceVersionPreconditions", run: scenarioPreconditions},
		{name: "PaginatedList5000AtFixedRV", run: scenarioPaginatedList},
		{name: "ListExactOldRV", run: scenarioExactOldRV},
		{name: "WatchResume", run: scenarioWatchResume},
		{name: "WatchBookmarks", reference: true, run: scenarioBookmarks},
		{name: "WatchList", reference: true, run: scenarioWatchList},
		{name: "Expiry", run: func(t *testing.T, c *cluster) {
			t.Run("Gone410AfterCompaction", func(t *testing.T) { t.Parallel(); scenarioGone(t, c) })
			t.Run("EventsExpireViaLeases", func(t *testing.T) { t.Parallel(); scenarioEvents(t, c) })
		}},
		{name: "StoreRestart", run: scenarioStoreRestart},
		{name: "ControlPlane", run: scenarioControlPlane},
		{name: "ConsistencyChecker", reference: true, run: scenarioConsistencyChecker},
		{name: "ApiserverLog", reference: true, run: scenarioLog},
		{name: "MasterleasesExpireAfterStop", run: scenarioMasterleases},
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

func obj(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	m := map[string]any{}
	must(t, yaml.Unmarshal([]byte(y), &m), "yaml")
	return &unstructured.Unstructured{Object: m}
}

func ensureNamespace(t *testing.T, c *cluster, ns string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

// --- Health ---------------------------------------------------------------

func scenarioHealth(t *testing.T, c *cluster) {
	ctx := ctxT(t, time.Minute)
	for _, p := range []string{"/livez", "/readyz"} {
		body, err := c.client.CoreV1().RESTClient().Get().AbsPath(p).Param("verbose", "true").DoRaw(ctx)
		must(t, err, "GET %s", p)
		s := string(body)
		if !strings.Contains(s, "[+]etcd ok") || strings.Contains(s, "[-]") {
			t.Errorf("GET %s?verbose:\n%s", p, s)
		}
	}
}

// --- CRUD -----------------------------------------------------------------

type crudCase struct {
	gvr        schema.GroupVersionResource
	namespaced bool
	manifest   string
}

func scenarioCRUD(t *testing.T, c *cluster) {
	const ns = "crud"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 5*time.Minute)
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := obj(t, `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.conformance.fdb-etcd.io}
spec:
  group: conformance.fdb-etcd.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
`)
	_, err := c.dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CRD: %v", err)
	}
	must(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := c.dyn.Resource(crdGVR).Get(ctx, "widgets.conformance.fdb-etcd.io", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, cd := range conds {
			m := cd.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	}), "CRD established")

	// ServiceAccount admission wants the namespace's default SA (no
	// controller-manager yet).
	_, err = c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create default SA: %v", err)
	}
	podSpec := `{containers: [{name: c, image: registry.k8s.io/pause:3.10}], restartPolicy: Never}`
	cases := []crudCase{
		{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, true, `{apiVersion: v1, kind: ConfigMap, metadata: {name: x}, data: {k: v}}`},
		{schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, true, `{apiVersion: v1, kind: Secret, metadata: {name: x}, stringData: {k: v}}`},
		{schema.GroupVersionResource{Version: "v1", Resource: "services"}, true, `{apiVersion: v1, kind: Service, metadata: {name: x}, spec: {ports: [{port: 80}], selector: {app: x}}}`},
		{schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true, `{apiVersion: v1, kind: ServiceAccount, metadata: {name: x}}`},
		{schema.GroupVersionResource{Version: "v1", Resource: "pods"}, true, `{apiVersion: v1, kind: Pod, metadata: {name: x}, spec: ` + podSpec + `}`},
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, true, `{apiVersion: apps/v1, kind: Deployment, metadata: {name: x}, spec: {replicas: 1, selector: {matchLabels: {app: x}}, template: {metadata: {labels: {app: x}}, spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}}}}`},
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, true, `{apiVersion: apps/v1, kind: StatefulSet, metadata: {name: x}, spec: {replicas: 1, serviceName: x, selector: {matchLabels: {app: x}}, template: {metadata: {labels: {app: x}}, spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}}}}`},
		{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, true, `{apiVersion: batch/v1, kind: Job, metadata: {name: x}, spec: {template: {spec: ` + podSpec + `}}}`},
		{schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "cronjobs"}, true, `{apiVersion: batch/v1, kind: CronJob, metadata: {name: x}, spec: {schedule: "*/5 * * * *", jobTemplate: {spec: {template: {spec: ` + podSpec + `}}}}}`},
		{schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}, true, `{apiVersion: coordination.k8s.io/v1, kind: Lease, metadata: {name: x}, spec: {holderIdentity: a, leaseDurationSeconds: 15}}`},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true, `{apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: x}, rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]}`},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true, `{apiVersion: rbac.authorization.k8s.io/v1, kind: RoleBinding, metadata: {name: x}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: x}, subjects: [{kind: User, name: someone}]}`},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false, `{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: conformance-x}, rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]}`},
		{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false, `{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding, metadata: {name: conformance-x}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: conformance-x}, subjects: [{kind: User, name: someone}]}`},
		{schema.GroupVersionResource{Group: "conformance.fdb-etcd.io", Version: "v1", Resource: "widgets"}, true, `{apiVersion: conformance.fdb-etcd.io/v1, kind: Widget, metadata: {name: x}, spec: {size: 3}}`},
	}
	for _, cc := range cases {
		cc := cc
		t.Run(cc.gvr.Resource, func(t *testing.T) {
			var ri = c.dyn.Resource(cc.gvr)
			var r interface {
				Create(context.Context, *unstructured.Unstructured, metav1.CreateOptions, ...string) (*unstructured.Unstructured, error)
				Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
				List(context.Context, metav1.ListOptions) (*unstructured.UnstructuredList, error)
				Update(context.Context, *unstructured.Unstructured, metav1.UpdateOptions, ...string) (*unstructured.Unstructured, error)
				Delete(context.Context, string, metav1.DeleteOptions, ...string) error
			} = ri
			if cc.namespaced {
				r = ri.Namespace(ns)
			}
			o := obj(t, cc.manifest)
			name := o.GetName()
			// CRDs become served asynchronously: retry the first create briefly.
			var created *unstructured.Unstructured
			err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				var err error
				created, err = r.Create(ctx, o.DeepCopy(), metav1.CreateOptions{})
				if apierrors.IsNotFound(err) {
					return false, nil
				}
				return err == nil, err
			})
			must(t, err, "create %s", cc.gvr.Resource)
			got, err := r.Get(ctx, name, metav1.GetOptions{})
			must(t, err, "get")
			if got.GetResourceVersion() != created.GetResourceVersion() {
				t.Errorf("get returned RV %s, create %s", got.GetResourceVersion(), created.GetResourceVersion())
			}
			list, err := r.List(ctx, metav1.ListOptions{})
			must(t, err, "list")
			found := false
			for _, it := range list.Items {
				found = found || it.GetName() == name
			}
			if !found {
				t.Errorf("list (RV %s) lacks %s", list.GetResourceVersion(), name)
			}
			got.SetLabels(map[string]string{"updated": "true"})
			upd, err := r.Update(ctx, got, metav1.UpdateOptions{})
			must(t, err, "update")
			if upd.GetResourceVersion() == got.GetResourceVersion() {
				t.Errorf("update kept RV %s", upd.GetResourceVersion())
			}
			got2, err := r.Get(ctx, name, metav1.GetOptions{})
			must(t, err, "get after update")
			if got2.GetLabels()["updated"] != "true" || got2.GetResourceVersion() != upd.GetResourceVersion() {
				t.Errorf("get after update: labels %v RV %s, want RV %s", got2.GetLabels(), got2.GetResourceVersion(), upd.GetResourceVersion())
			}
			// Background propagation: batch/v1 Jobs default to orphaning,
			// whose finalizer only the (not yet running) garbage collector removes.
			must(t, r.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}), "delete")
			must(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				_, err := r.Get(ctx, name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			}), "wait for %s/%s to be gone", cc.gvr.Resource, name)
		})
	}
	// A few CRs, listed and deleted as a collection; then the CRD.
	w := c.dyn.Resource(schema.GroupVersionResource{Group: "conformance.fdb-etcd.io", Version: "v1", Resource: "widgets"}).Namespace(ns)
	for i := 0; i < 20; i++ {
		_, err := w.Create(ctx, obj(t, fmt.Sprintf(`{apiVersion: conformance.fdb-etcd.io/v1, kind: Widget, metadata: {name: w%d}, spec: {size: %d}}`, i, i)), metav1.CreateOptions{})
		must(t, err, "create widget %d", i)
	}
	l, err := w.List(ctx, metav1.ListOptions{Limit: 7})
	must(t, err, "list widgets")
	total := len(l.Items)
	for l.GetContinue() != "" {
		l, err = w.List(ctx, metav1.ListOptions{Limit: 7, Continue: l.GetContinue()})
		must(t, err, "list widgets (continue)")
		total += len(l.Items)
	}
	if total != 20 {
		t.Errorf("paged widget list: %d items, want 20", total)
	}
	must(t, w.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}), "deletecollection widgets")
	must(t, c.dyn.Resource(crdGVR).Delete(ctx, "widgets.conformance.fdb-etcd.io", metav1.DeleteOptions{}), "delete CRD")
	must(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.dyn.Resource(crdGVR).Get(ctx, "widgets.conformance.fdb-etcd.io", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}), "CRD deletion")
}

// --- Server-side apply ----------------------------------------------------

func scenarioSSA(t *testing.T, c *cluster) {
	const ns = "ssa"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	_, err := cms.Apply(ctx, applycorev1.ConfigMap("cfg", ns).WithData(map[string]string{"a": "1", "b": "1"}), metav1.ApplyOptions{FieldManager: "alice"})
	must(t, err, "apply as alice")
	_, err = cms.Apply(ctx, applycorev1.ConfigMap("cfg", ns).WithData(map[string]string{"a": "2"}), metav1.ApplyOptions{FieldManager: "bob"})
	if !apierrors.IsConflict(err) {
		t.Fatalf("conflicting apply as bob: got %v, want a 409 conflict", err)
	}
	got, err := cms.Apply(ctx, applycorev1.ConfigMap("cfg", ns).WithData(map[string]string{"a": "2"}), metav1.ApplyOptions{FieldManager: "bob", Force: true})
	must(t, err, "forced apply as bob")
	if got.Data["a"] != "2" || got.Data["b"] != "1" {
		t.Errorf("after forced apply: data %v", got.Data)
	}
	managers := map[string]bool{}
	for _, mf := range got.ManagedFields {
		managers[mf.Manager] = true
	}
	if !managers["alice"] || !managers["bob"] {
		t.Errorf("managedFields managers %v, want alice and bob", managers)
	}
	// alice drops b: it disappears (she was its only owner).
	got, err = cms.Apply(ctx, applycorev1.ConfigMap("cfg", ns).WithData(map[string]string{}), metav1.ApplyOptions{FieldManager: "alice"})
	must(t, err, "apply as alice without b")
	if _, ok := got.Data["b"]; ok || got.Data["a"] != "2" {
		t.Errorf("after alice drops b: data %v", got.Data)
	}
}

// --- resourceVersion preconditions and conflicts ----------------------------

func scenarioPreconditions(t *testing.T, c *cluster) {
	const ns = "precond"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	v1, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
	must(t, err, "create")
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		t.Errorf("second create: %v, want AlreadyExists", err)
	}
	v2 := v1.DeepCopy()
	v2.Data["v"] = "2"
	v2, err = cms.Update(ctx, v2, metav1.UpdateOptions{})
	must(t, err, "update at current RV")
	stale := v1.DeepCopy()
	stale.Data["v"] = "stale"
	if _, err = cms.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update with stale RV %s: %v, want 409 Conflict", v1.ResourceVersion, err)
	}
	// Concurrent read-modify-write loops: every increment lands exactly once.
	var wg sync.WaitGroup
	var conflicts atomic.Int64
	const writers, each = 4, 10
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				for {
					cur, err := cms.Get(ctx, "p", metav1.GetOptions{})
					if err != nil {
						t.Error(err)
						return
					}
					n := 0
					fmt.Sscan(cur.Data["n"], &n)
					cur.Data["n"] = fmt.Sprint(n + 1)
					if _, err = cms.Update(ctx, cur, metav1.UpdateOptions{}); err == nil {
						break
					} else if !apierrors.IsConflict(err) {
						t.Error(err)
						return
					}
					conflicts.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	cur, err := cms.Get(ctx, "p", metav1.GetOptions{})
	must(t, err, "get")
	if cur.Data["n"] != fmt.Sprint(writers*each) {
		t.Errorf("after %d optimistic increments n=%s", writers*each, cur.Data["n"])
	}
	t.Logf("%d increments, %d conflicts retried", writers*each, conflicts.Load())
	// Delete preconditions.
	err = cms.Delete(ctx, "p", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &v2.ResourceVersion}})
	if !apierrors.IsConflict(err) {
		t.Errorf("delete with stale RV precondition: %v, want 409 Conflict", err)
	}
	wrongUID := types.UID("00000000-0000-0000-0000-000000000000")
	if err = cms.Delete(ctx, "p", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &wrongUID}}); !apierrors.IsConflict(err) {
		t.Errorf("delete with wrong UID precondition: %v, want 409 Conflict", err)
	}
	must(t, cms.Delete(ctx, "p", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &cur.ResourceVersion, UID: &cur.UID}}), "delete with matching preconditions")
	if _, err = cms.Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get after delete: %v", err)
	}
	if _, err = cms.Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		t.Errorf("update of deleted object: %v", err)
	}
}

// --- paginated LIST over 5,000 objects at a fixed RV while writes continue --

func createConfigMaps(t *testing.T, c *cluster, ns, prefix string, n, workers int) {
	t.Helper()
	ctx := ctxT(t, 10*time.Minute)
	var wg sync.WaitGroup
	next := atomic.Int64{}
	errs := atomic.Int64{}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || errs.Load() > 0 {
					return
				}
				_, err := c.client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d", prefix, i), Labels: map[string]string{"set": prefix}},
					Data:       map[string]string{"payload": strings.Repeat("x", 256)},
				}, metav1.CreateOptions{})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					errs.Add(1)
					t.Errorf("create %s-%05d: %v", prefix, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if errs.Load() > 0 {
		t.FailNow()
	}
}

// writer keeps writing ConfigMaps in ns until stopped; returns the count.
func startWriter(t *testing.T, c *cluster, ns string, interval time.Duration) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			name := fmt.Sprintf("churn-%d", i%50)
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
			_, err := c.client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				_, err = c.client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
			}
			if err == nil {
				n.Add(1)
			}
		}
	}()
	return func() int64 { cancel(); <-done; return n.Load() }
}

func scenarioPaginatedList(t *testing.T, c *cluster) {
	const ns, total = "bulk", 5000
	ensureNamespace(t, c, ns)
	start := time.Now()
	createConfigMaps(t, c, ns, "base", total, 16)
	t.Logf("created %d ConfigMaps in %v", total, time.Since(start).Round(time.Millisecond))
	stop := startWriter(t, c, ns, 10*time.Millisecond)
	defer stop()
	ctx := ctxT(t, 5*time.Minute)
	for round, rv := range []string{"", "0"} { // consistent (etcd) and from the watch cache
		seen := map[string]bool{}
		var listRV string
		pages := 0
		opts := metav1.ListOptions{Limit: 500, ResourceVersion: rv}
		lstart := time.Now()
		for {
			l, err := c.client.CoreV1().ConfigMaps(ns).List(ctx, opts)
			must(t, err, "list page %d", pages)
			pages++
			if listRV == "" {
				listRV = l.ResourceVersion
			} else if l.ResourceVersion != listRV {
				t.Errorf("round %d page %d RV %s, first page RV %s", round, pages, l.ResourceVersion, listRV)
			}
			for _, it := range l.Items {
				if seen[it.Name] {
					t.Errorf("duplicate %s across pages", it.Name)
				}
				seen[it.Name] = true
				if cmpRV(it.ResourceVersion, listRV) > 0 {
					t.Errorf("%s has RV %s above the list RV %s", it.Name, it.ResourceVersion, listRV)
				}
			}
			if l.Continue == "" {
				break
			}
			opts = metav1.ListOptions{Limit: 500, Continue: l.Continue}
			time.Sleep(20 * time.Millisecond) // let writes land between pages
		}
		base := 0
		for n := range seen {
			if strings.HasPrefix(n, "base-") {
				base++
			}
		}
		if base != total {
			t.Errorf("round %d: %d base objects over %d pages, want %d", round, base, pages, total)
		}
		// The same list at exactly listRV, unpaginated, must agree.
		exact, err := c.client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{ResourceVersion: listRV, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
		must(t, err, "exact list at %s", listRV)
		if len(exact.Items) != len(seen) {
			t.Errorf("round %d: paginated list at RV %s saw %d objects, exact list %d", round, listRV, len(seen), len(exact.Items))
		}
		t.Logf("round %d (rv=%q): %d objects in %d pages at RV %s in %v", round, rv, len(seen), pages, listRV, time.Since(lstart).Round(time.Millisecond))
	}
	t.Logf("writer made %d writes meanwhile", stop())
}

func cmpRV(a, b string) int {
	var x, y uint64
	fmt.Sscan(a, &x)
	fmt.Sscan(b, &y)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// --- LIST with resourceVersionMatch=Exact on an old RV ----------------------

func scenarioExactOldRV(t *testing.T, c *cluster) {
	const ns = "exact"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	for i := 0; i < 5; i++ {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("e", i)}, Data: map[string]string{"gen": "1"}}, metav1.CreateOptions{})
		must(t, err, "create")
	}
	old, err := cms.List(ctx, metav1.ListOptions{})
	must(t, err, "list")
	must(t, cms.Delete(ctx, "e0", metav1.DeleteOptions{}), "delete e0")
	e1, err := cms.Get(ctx, "e1", metav1.GetOptions{})
	must(t, err, "get")
	e1.Data["gen"] = "2"
	_, err = cms.Update(ctx, e1, metav1.UpdateOptions{})
	must(t, err, "update e1")
	_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "e9"}}, metav1.CreateOptions{})
	must(t, err, "create e9")
	for _, limit := range []int64{0, 2} {
		got := map[string]string{}
		opts := metav1.ListOptions{ResourceVersion: old.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: limit}
		for {
			l, err := cms.List(ctx, opts)
			must(t, err, "exact list at old RV %s (limit %d)", old.ResourceVersion, limit)
			if l.ResourceVersion != old.ResourceVersion {
				t.Errorf("exact list returned RV %s, want %s", l.ResourceVersion, old.ResourceVersion)
			}
			for _, it := range l.Items {
				got[it.Name] = it.Data["gen"]
			}
			if l.Continue == "" {
				break
			}
			opts = metav1.ListOptions{Continue: l.Continue, Limit: limit}
		}
		want := map[string]string{"e0": "1", "e1": "1", "e2": "1", "e3": "1", "e4": "1"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("exact list at %s (limit %d): %v, want %v", old.ResourceVersion, limit, got, want)
		}
	}
}

// --- watch resume, bookmarks, WatchList --------------------------------------

func nextEvent(t *testing.T, w watch.Interface, d time.Duration) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatalf("watch closed")
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no watch event within %v", d)
	}
	return watch.Event{}
}

func scenarioWatchResume(t *testing.T, c *cluster) {
	const ns = "watch"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 2*time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w"}, Data: map[string]string{"i": "0"}}, metav1.CreateOptions{})
	must(t, err, "create")
	rv0 := cm.ResourceVersion
	var rvs []string
	for i := 1; i <= 5; i++ {
		cm.Data["i"] = fmt.Sprint(i)
		cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		must(t, err, "update %d", i)
		rvs = append(rvs, cm.ResourceVersion)
	}
	must(t, cms.Delete(ctx, "w", metav1.DeleteOptions{}), "delete")
	for _, from := range []int{-1, 2} { // resume from the create, and from the middle
		start := rv0
		if from >= 0 {
			start = rvs[from]
		}
		w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: start})
		must(t, err, "watch from %s", start)
		for i := from + 1; i < len(rvs); i++ {
			ev := nextEvent(t, w, 10*time.Second)
			got := ev.Object.(*corev1.ConfigMap)
			if ev.Type != watch.Modified || got.ResourceVersion != rvs[i] || got.Data["i"] != fmt.Sprint(i+1) {
				t.Fatalf("resume from %s: event %s RV %s data %v, want MODIFIED RV %s i=%d", start, ev.Type, got.ResourceVersion, got.Data, rvs[i], i+1)
			}
		}
		ev := nextEvent(t, w, 10*time.Second)
		if ev.Type != watch.Deleted {
			t.Fatalf("resume from %s: last event %s, want DELETED", start, ev.Type)
		}
		w.Stop()
	}
	// Events after the watch started, and resuming from the last one seen.
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: rvs[len(rvs)-1]})
	must(t, err, "watch")
	_ = nextEvent(t, w, 10*time.Second) // the delete
	created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w2"}}, metav1.CreateOptions{})
	must(t, err, "create w2")
	ev := nextEvent(t, w, 10*time.Second)
	if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).ResourceVersion != created.ResourceVersion {
		t.Fatalf("live event %s %s, want ADDED %s", ev.Type, ev.Object.(*corev1.ConfigMap).ResourceVersion, created.ResourceVersion)
	}
	w.Stop()
}

func scenarioBookmarks(t *testing.T, c *cluster) {
	const ns = "bookmarks"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 2*time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{})
	must(t, err, "create")
	// The watch cache sends a bookmark shortly before a watch's timeout, at
	// the newest resourceVersion it has processed, if that is past the
	// watch's: writes in another namespace move it on.
	ensureNamespace(t, c, "bookmarks-churn")
	stop := startWriter(t, c, "bookmarks-churn", 200*time.Millisecond)
	defer stop()
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: cm.ResourceVersion, AllowWatchBookmarks: true, TimeoutSeconds: ptr.To[int64](10)})
	must(t, err, "watch")
	defer w.Stop()
	deadline := time.After(40 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch ended without a bookmark")
			}
			if ev.Type != watch.Bookmark {
				t.Fatalf("unexpected %s event for %s/%s", ev.Type, ev.Object.(*corev1.ConfigMap).Namespace, ev.Object.(*corev1.ConfigMap).Name)
			}
			if ev.Type == watch.Bookmark {
				rv := ev.Object.(*corev1.ConfigMap).ResourceVersion
				if cmpRV(rv, cm.ResourceVersion) <= 0 {
					t.Errorf("bookmark RV %s not past the watch's start %s", rv, cm.ResourceVersion)
				}
				t.Logf("bookmark at RV %s (watch from %s)", rv, cm.ResourceVersion)
				return
			}
		case <-deadline:
			t.Fatal("no bookmark within 40s")
		}
	}
}

func scenarioWatchList(t *testing.T, c *cluster) {
	const ns = "watchlist"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 2*time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	want := map[string]bool{}
	for i := 0; i < 30; i++ {
		name := fmt.Sprint("wl", i)
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		must(t, err, "create")
		want[name] = true
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	must(t, err, "watch-list")
	defer w.Stop()
	got := map[string]bool{}
	for {
		ev := nextEvent(t, w, 20*time.Second)
		switch ev.Type {
		case watch.Added:
			got[ev.Object.(*corev1.ConfigMap).Name] = true
		case watch.Bookmark:
			m := ev.Object.(*corev1.ConfigMap)
			if m.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
				continue
			}
			if len(got) != len(want) {
				t.Fatalf("initial-events-end bookmark after %d objects, want %d", len(got), len(want))
			}
			t.Logf("initial-events-end bookmark at RV %s after %d objects", m.ResourceVersion, len(got))
			// The stream continues with live events.
			_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{})
			must(t, err, "create late")
			for {
				ev := nextEvent(t, w, 20*time.Second)
				if ev.Type == watch.Added && ev.Object.(*corev1.ConfigMap).Name == "late" {
					return
				}
			}
		case watch.Error:
			t.Fatalf("watch-list error: %v", apierrors.FromObject(ev.Object))
		default:
			t.Fatalf("unexpected %s event during initial events", ev.Type)
		}
	}
}

// --- 410 Gone after compaction; Events expiring via leases -----------------

func scenarioGone(t *testing.T, c *cluster) {
	const ns = "gone"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 5*time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	for i := 0; i < 3; i++ {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("g", i)}}, metav1.CreateOptions{})
		must(t, err, "create")
	}
	first, err := cms.List(ctx, metav1.ListOptions{Limit: 1})
	must(t, err, "list")
	oldRV, cont := first.ResourceVersion, first.Continue
	// Keep writing so that compaction has something to compact past.
	for i := 0; i < 3; i++ {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("h", i)}}, metav1.CreateOptions{})
		must(t, err, "create")
	}
	start := time.Now()
	var exactErr, contErr error
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 4*compactionInterval+30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, exactErr = cms.List(ctx, metav1.ListOptions{ResourceVersion: oldRV, ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: 1})
		_, contErr = cms.List(ctx, metav1.ListOptions{Limit: 1, Continue: cont})
		return exactErr != nil && contErr != nil, nil
	})
	if err != nil {
		t.Fatalf("no 410 within %v of compaction interval %v: exact list at %s: %v; continue: %v", time.Since(start).Round(time.Second), compactionInterval, oldRV, exactErr, contErr)
	}
	if !apierrors.IsGone(exactErr) && !apierrors.IsResourceExpired(exactErr) {
		t.Errorf("exact list at compacted RV %s: %v (reason %s), want 410", oldRV, exactErr, apierrors.ReasonForError(exactErr))
	}
	if !apierrors.IsResourceExpired(contErr) && !apierrors.IsGone(contErr) {
		t.Errorf("continue from compacted RV %s: %v, want 410 Expired", oldRV, contErr)
	}
	t.Logf("410 after %v: exact: %v; continue: %v", time.Since(start).Round(time.Second), exactErr, contErr)
}

func scenarioEvents(t *testing.T, c *cluster) {
	const ns = "events"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 5*time.Minute)
	ev, err := c.client.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e1"},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "x"},
		Reason:         "Conformance", Message: "expires via its lease", Type: corev1.EventTypeNormal,
	}, metav1.CreateOptions{})
	must(t, err, "create event")
	created := time.Now()
	resp, err := c.store.client.Get(ctx, "/registry/events/"+ns+"/e1")
	must(t, err, "etcd get")
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("event key in etcd: %d kvs, lease %v; want one key with a lease", len(resp.Kvs), leaseOf(resp))
	}
	ttl, err := c.store.client.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	must(t, err, "lease TTL")
	t.Logf("event %s RV %s on lease %x, TTL %ds (granted %ds)", ev.Name, ev.ResourceVersion, resp.Kvs[0].Lease, ttl.TTL, ttl.GrantedTTL)
	err = wait.PollUntilContextTimeout(ctx, time.Second, eventTTL+90*time.Second, false, func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Events(ns).Get(ctx, "e1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("event still there %v after creation (--event-ttl %v)", time.Since(created).Round(time.Second), eventTTL)
	}
	t.Logf("event gone %v after creation (--event-ttl %v)", time.Since(created).Round(time.Second), eventTTL)
}

func leaseOf(r *clientv3.GetResponse) any {
	if len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0].Lease
}

// --- fdb-etcd restarted under a running apiserver ---------------------------

func scenarioStoreRestart(t *testing.T, c *cluster) {
	if c.store.restart == nil {
		t.Skip("only fdb-etcd restarts in place")
	}
	const ns = "restart"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 5*time.Minute)
	cms := c.client.CoreV1().ConfigMaps(ns)
	var last *corev1.ConfigMap
	for i := 0; i < 20; i++ {
		var err error
		last, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("before-", i)}}, metav1.CreateOptions{})
		must(t, err, "create")
	}
	before, err := cms.List(ctx, metav1.ListOptions{})
	must(t, err, "list")
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: last.ResourceVersion})
	must(t, err, "watch")
	defer w.Stop()
	start := time.Now()
	must(t, c.store.restart(), "restart fdb-etcd")
	t.Logf("fdb-etcd restarted in %v", time.Since(start).Round(time.Millisecond))
	// The apiserver reconnects: ready again, and writes continue the revision.
	must(t, wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := c.client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	}), "readyz after the restart")
	var after *corev1.ConfigMap
	must(t, wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		after, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	}), "create after the restart")
	if after.ResourceVersion == "" {
		after, err = cms.Get(ctx, "after", metav1.GetOptions{})
		must(t, err, "get after")
	}
	if cmpRV(after.ResourceVersion, before.ResourceVersion) <= 0 {
		t.Errorf("RV after the restart %s, not past %s", after.ResourceVersion, before.ResourceVersion)
	}
	t.Logf("ready and writing %v after the restart (RV %s -> %s)", time.Since(start).Round(time.Millisecond), before.ResourceVersion, after.ResourceVersion)
	// A watch opened before the restart carries on, without gaps.
	for {
		ev := nextEvent(t, w, time.Minute)
		if ev.Type == watch.Error {
			t.Fatalf("watch across the restart: %v", apierrors.FromObject(ev.Object))
		}
		got := ev.Object.(*corev1.ConfigMap)
		if ev.Type == watch.Added && got.Name == "after" {
			if got.ResourceVersion != after.ResourceVersion {
				t.Errorf("watch saw after at RV %s, created at %s", got.ResourceVersion, after.ResourceVersion)
			}
			break
		}
		t.Fatalf("unexpected %s %s (RV %s) across the restart", ev.Type, got.Name, got.ResourceVersion)
	}
	// Nothing lost; history before the restart still readable.
	now, err := cms.List(ctx, metav1.ListOptions{})
	must(t, err, "list after")
	if len(now.Items) != len(before.Items)+1 {
		t.Errorf("%d objects after the restart, want %d", len(now.Items), len(before.Items)+1)
	}
	exact, err := cms.List(ctx, metav1.ListOptions{ResourceVersion: before.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: 100})
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		if time.Since(start) > compactionInterval {
			t.Logf("pre-restart RV %s compacted meanwhile (%v since the restart)", before.ResourceVersion, time.Since(start).Round(time.Second))
			return
		}
	}
	must(t, err, "exact list at the pre-restart RV %s", before.ResourceVersion)
	if len(exact.Items) != len(before.Items) {
		t.Errorf("exact list at the pre-restart RV: %d objects, want %d", len(exact.Items), len(before.Items))
	}
}

// --- control plane -----------------------------------------------------------

func scenarioControlPlane(t *testing.T, c *cluster) {
	must(t, c.startControlPlane(), "start controller-manager and scheduler")
	const ns = "cp"
	ensureNamespace(t, c, ns)
	ctx := ctxT(t, 8*time.Minute)
	alive := func() {
		for _, p := range []*proc{c.kcm, c.sched} {
			if p.exited() {
				t.Fatalf("%s exited: %v\n%s", p.name, p.err, tail(p.log(), 3000))
			}
		}
	}
	dep := obj(t, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 50
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}
`)
	deps := c.dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace(ns)
	_, err := deps.Create(ctx, dep, metav1.CreateOptions{})
	must(t, err, "create deployment")
	start := time.Now()
	podCount := func() (total, pending int) {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return -1, -1
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			total++
			if p.Status.Phase == corev1.PodPending {
				pending++
			}
		}
		return
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		alive()
		n, p := podCount()
		return n == 50 && p == 50, nil
	})
	n, p := podCount()
	if err != nil {
		t.Fatalf("after %v: %d pods (%d Pending), want 50 Pending", time.Since(start).Round(time.Second), n, p)
	}
	rss, err := c.client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	must(t, err, "list replicasets")
	if len(rss.Items) != 1 || ptr.Deref(rss.Items[0].Spec.Replicas, 0) != 50 {
		t.Errorf("replicasets: %d, want one with 50 replicas", len(rss.Items))
	}
	t.Logf("Deployment -> ReplicaSet -> 50 Pending pods in %v", time.Since(start).Round(time.Second))
	// The scheduler saw them: unschedulable (there are no nodes).
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web", Limit: 5})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		for _, cd := range pods.Items[0].Status.Conditions {
			if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no pod got PodScheduled=False from the scheduler")
	}
	// Scale down.
	start = time.Now()
	_, err = c.client.AppsV1().Deployments(ns).Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"replicas":5}}`), metav1.PatchOptions{})
	must(t, err, "scale down")
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		alive()
		n, _ := podCount()
		return n == 5, nil
	})
	if err != nil {
		n, _ := podCount()
		t.Fatalf("after scaling to 5: %d pods", n)
	}
	t.Logf("scaled 50 -> 5 in %v", time.Since(start).Round(time.Second))
	// Namespace deletion cascades.
	start = time.Now()
	must(t, c.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}), "delete namespace")
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		alive()
		_, err := c.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("namespace %s not deleted after %v", ns, time.Since(start).Round(time.Second))
	}
	for _, what := range []string{"pods", "replicasets", "deployments"} {
		resp, err := c.store.client.Get(ctx, "/registry/"+what+"/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		must(t, err, "etcd count")
		if resp.Count != 0 {
			t.Errorf("%d %s keys left in storage after the namespace was deleted", resp.Count, what)
		}
	}
	t.Logf("namespace deletion cascaded in %v", time.Since(start).Round(time.Second))
}

// --- the whole run's invariants ----------------------------------------------

// consistencyCheckWait bounds the wait for the apiserver's checker, which
// runs every 5-7.5 minutes per resource (consistency.CheckPeriod, jittered).
const consistencyCheckWait = 8 * time.Minute

func scenarioConsistencyChecker(t *testing.T, c *cluster) {
	ctx := ctxT(t, 10*time.Minute)
	var m string
	// On fdb-etcd wait for the checker to have compared the busiest
	// resource, ConfigMaps, with storage at least once.
	deadline := c.started.Add(consistencyCheckWait)
	for {
		if c.apiserver.exited() {
			t.Fatalf("kube-apiserver exited (a consistency-check panic?): %v\n%s", c.apiserver.err, tail(c.apiserver.log(), 4000))
		}
		var err error
		m, err = c.metrics(ctx)
		must(t, err, "metrics")
		if c.store.reference || metricSum(m, "apiserver_storage_consistency_checks_total", `resource="configmaps"`) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Second)
	}
	fail := metricSum(m, "apiserver_storage_consistency_checks_total", `status="failure"`)
	ok := metricSum(m, "apiserver_storage_consistency_checks_total", `status="success"`)
	errs := metricSum(m, "apiserver_storage_consistency_checks_total", `status="error"`)
	cm := metricSum(m, "apiserver_storage_consistency_checks_total", `resource="configmaps"`, `status="success"`)
	t.Logf("watch-cache consistency checks %v after start: %v passed (configmaps: %v), %v failed, %v errors", time.Since(c.started).Round(time.Second), ok, cm, fail, errs)
	if fail != 0 {
		t.Errorf("%v watch-cache consistency checks failed", fail)
	}
	if !c.store.reference && cm == 0 {
		t.Errorf("the consistency checker never passed for configmaps within %v of the apiserver's start", consistencyCheckWait)
	}
}

func scenarioLog(t *testing.T, c *cluster) {
	log := c.apiserver.log()
	for _, bad := range []string{"RequestWatchProgress feature is not supported", "Cache consistency check failed"} {
		if strings.Contains(log, bad) {
			i := strings.Index(log, bad)
			t.Errorf("kube-apiserver log contains %q: %s", bad, log[max(0, i-300):min(len(log), i+300)])
		}
	}
	for _, p := range []*proc{c.kcm, c.sched} {
		if p != nil && p.exited() {
			t.Errorf("%s exited: %v", p.name, p.err)
		}
	}
}

func scenarioMasterleases(t *testing.T, c *cluster) {
	ctx := ctxT(t, 3*time.Minute)
	resp, err := c.store.client.Get(ctx, "/registry/masterleases/", clientv3.WithPrefix())
	must(t, err, "etcd get masterleases")
	if len(resp.Kvs) == 0 {
		t.Fatal("no /registry/masterleases/ keys while the apiserver runs")
	}
	for _, kv := range resp.Kvs {
		if kv.Lease == 0 {
			t.Errorf("%s has no lease", kv.Key)
		}
	}
	// Kill (not stop: a graceful stop removes its own key) the control plane.
	for _, p := range []*proc{c.sched, c.kcm, c.apiserver} {
		if p != nil {
			p.stop(syscall.SIGKILL)
		}
	}
	killed := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := c.store.client.Get(ctx, "/registry/masterleases/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0, nil
	})
	if err != nil {
		t.Fatalf("/registry/masterleases/ keys still there %v after the apiserver was killed", time.Since(killed).Round(time.Second))
	}
	t.Logf("masterleases keys expired %v after the apiserver was killed", time.Since(killed).Round(time.Second))
}
