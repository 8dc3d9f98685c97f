package scenarios

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// marker is what one tenant's apiserver created for the isolation checks:
// a namespace of its own with a ConfigMap, and a ConfigMap whose name the
// other tenant uses too, each holding the tenant's name.
type marker struct {
	tenant    string
	namespace string
	nsUID     types.UID
	sharedUID types.UID
}

// sharedMarkerName is a ConfigMap both tenants create in namespace default:
// each must keep its own.
const sharedMarkerName = "same-name-in-both-tenants"

func createMarkers(t *testing.T, cs [2]*cluster) [2]marker {
	t.Helper()
	var ms [2]marker
	for i, c := range cs {
		ctx := ctxT(t, time.Minute)
		m := marker{tenant: tenantNames[i], namespace: "only-" + tenantNames[i]}
		ns, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.namespace}}, metav1.CreateOptions{})
		must(t, err, "%s: create namespace %s", m.tenant, m.namespace)
		m.nsUID = ns.UID
		data := map[string]string{"tenant": m.tenant}
		_, err = c.client.CoreV1().ConfigMaps(m.namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marker"}, Data: data}, metav1.CreateOptions{})
		must(t, err, "%s: create its marker ConfigMap", m.tenant)
		// Both create the same name: on one keyspace the second would
		// get AlreadyExists.
		cm, err := c.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: sharedMarkerName}, Data: data}, metav1.CreateOptions{})
		if err != nil {
			// Not fatal: the isolation checks then show what is shared.
			t.Errorf("%s: create ConfigMap default/%s: %v", m.tenant, sharedMarkerName, err)
		} else {
			m.sharedUID = cm.UID
		}
		ms[i] = m
	}
	return ms
}

// checkIsolation checks, for each tenant, that its apiserver sees its own
// markers and none of the other's, that the two apiservers have no object
// in common (every object's UID is the creation's own, so one keyspace
// behind both would show the same UIDs through both), and that a raw etcd
// client of the tenant finds nothing of the other's.
func checkIsolation(t *testing.T, cs [2]*cluster, ms [2]marker) {
	for i := range cs {
		j := 1 - i
		t.Run(tenantNames[i], func(t *testing.T) {
			checkOwnMarkers(t, cs[i], ms[i])
			checkForeignMarkers(t, cs[i], ms[i], ms[j])
			checkRawKeyspace(t, cs[i], ms[i], ms[j])
		})
	}
	t.Run("NoObjectInBoth", func(t *testing.T) { checkDisjointUIDs(t, cs) })
}

func checkOwnMarkers(t *testing.T, c *cluster, own marker) {
	ctx := ctxT(t, time.Minute)
	ns, err := c.client.CoreV1().Namespaces().Get(ctx, own.namespace, metav1.GetOptions{})
	must(t, err, "get its own namespace %s", own.namespace)
	if ns.UID != own.nsUID {
		t.Errorf("namespace %s has UID %s, created as %s", own.namespace, ns.UID, own.nsUID)
	}
	cm, err := c.client.CoreV1().ConfigMaps(own.namespace).Get(ctx, "marker", metav1.GetOptions{})
	must(t, err, "get its own marker ConfigMap")
	if cm.Data["tenant"] != own.tenant {
		t.Errorf("its marker ConfigMap holds %v, want tenant %s", cm.Data, own.tenant)
	}
}

// checkForeignMarkers: the other tenant's namespace is not found, and the
// ConfigMap both created under one name is this tenant's.
func checkForeignMarkers(t *testing.T, c *cluster, own, other marker) {
	ctx := ctxT(t, time.Minute)
	if _, err := c.client.CoreV1().Namespaces().Get(ctx, other.namespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s of %s through %s's apiserver: %v, want NotFound", other.namespace, other.tenant, own.tenant, err)
	}
	if _, err := c.client.CoreV1().ConfigMaps(other.namespace).Get(ctx, "marker", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s/marker of %s through %s's apiserver: %v, want NotFound", other.namespace, other.tenant, own.tenant, err)
	}
	cm, err := c.client.CoreV1().ConfigMaps("default").Get(ctx, sharedMarkerName, metav1.GetOptions{})
	must(t, err, "get default/%s", sharedMarkerName)
	if cm.UID != own.sharedUID || cm.Data["tenant"] != own.tenant {
		t.Errorf("default/%s through %s's apiserver is UID %s holding %v; %s created UID %s", sharedMarkerName, own.tenant, cm.UID, cm.Data, own.tenant, own.sharedUID)
	}
}

// checkRawKeyspace lists the tenant's whole keyspace with a raw etcd
// client of its own: its markers' keys are there, the other's are not, and
// no value carries one of the other's UIDs.
func checkRawKeyspace(t *testing.T, c *cluster, own, other marker) {
	ctx := ctxT(t, 2*time.Minute)
	resp, err := c.store.client.Get(ctx, "\x00", clientv3.WithFromKey())
	must(t, err, "raw etcd listing of %s's keyspace", own.tenant)
	keys := map[string]bool{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		keys[k] = true
		if strings.Contains(k, other.namespace) {
			t.Errorf("%s's keyspace holds %s, a key of %s's namespace", own.tenant, k, other.tenant)
		}
		for _, uid := range []types.UID{other.nsUID, other.sharedUID} {
			if uid != "" && bytes.Contains(kv.Value, []byte(uid)) {
				t.Errorf("%s's keyspace: %s holds UID %s, an object of %s", own.tenant, k, uid, other.tenant)
			}
		}
	}
	for _, k := range []string{"/registry/namespaces/" + own.namespace, "/registry/configmaps/" + own.namespace + "/marker", "/registry/configmaps/default/" + sharedMarkerName} {
		if !keys[k] {
			t.Errorf("%s's keyspace (%d keys at revision %d) has no %s", own.tenant, len(resp.Kvs), resp.Header.Revision, k)
		}
	}
	t.Logf("%s: %d keys at revision %d", own.tenant, len(resp.Kvs), resp.Header.Revision)
}

// isolationResources are listed through both apiservers for the UID check:
// the bootstrap objects each apiserver creates for itself, and what the
// scenarios create under the same names in both.
var isolationResources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "namespaces"},
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "secrets"},
	{Version: "v1", Resource: "serviceaccounts"},
	{Version: "v1", Resource: "services"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Resource: "prioritylevelconfigurations"},
}

func checkDisjointUIDs(t *testing.T, cs [2]*cluster) {
	ctx := ctxT(t, 3*time.Minute)
	var total [2]int
	for _, gvr := range isolationResources {
		var uids [2]map[types.UID]string
		for i, c := range cs {
			l, err := c.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			must(t, err, "%s: list %s", tenantNames[i], gvr.Resource)
			uids[i] = map[types.UID]string{}
			for _, o := range l.Items {
				uids[i][o.GetUID()] = o.GetNamespace() + "/" + o.GetName()
			}
			total[i] += len(l.Items)
		}
		var both []string
		for uid, name := range uids[0] {
			if _, ok := uids[1][uid]; ok {
				both = append(both, fmt.Sprintf("%s (uid %s)", name, uid))
			}
		}
		sort.Strings(both)
		if len(both) > 0 {
			t.Errorf("%d %s seen through both apiservers, e.g. %v", len(both), gvr.Resource, both[:min(len(both), 5)])
		}
	}
	t.Logf("objects of %d resources: %s %d, %s %d", len(isolationResources), tenantNames[0], total[0], tenantNames[1], total[1])
}
