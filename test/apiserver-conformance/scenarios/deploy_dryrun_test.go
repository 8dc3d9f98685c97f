package scenarios

import (
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// customRequired lists, per group/kind, the fields a custom resource in
// deploy/ must set; "a|b" means one of them. The test apiserver has none of
// these CRDs (nor their operators' webhooks), so this is all that checks
// them; an unserved kind missing here fails the test rather than passing
// unchecked. test/deploy checks the same fields plus cross-references.
var customRequired = map[schema.GroupKind][]string{
	{Group: "apps.foundationdb.org", Kind: "FoundationDBCluster"}: {"spec.version", "spec.databaseConfiguration.redundancy_mode"},
	{Group: "cert-manager.io", Kind: "Certificate"}:               {"spec.secretName", "spec.issuerRef.name", "spec.dnsNames|spec.commonName"},
	{Group: "cert-manager.io", Kind: "Issuer"}:                    {"spec.selfSigned|spec.ca|spec.acme|spec.vault|spec.venafi"},
	{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}:      {"spec.selector", "spec.endpoints"},
}

// renderedObject is one object of a rendered kustomization.
type renderedObject struct {
	kustomization string // relative to the repository root
	obj           *unstructured.Unstructured
}

func (r renderedObject) String() string {
	s := r.kustomization + ": " + r.obj.GetKind() + " "
	if ns := r.obj.GetNamespace(); ns != "" {
		s += ns + "/"
	}
	return s + r.obj.GetName()
}

// renderDeploy builds every kustomization under deploy/ with the kustomize
// library kubectl 1.37 vendors, so the objects are exactly what
// `kubectl apply -k` would send.
func renderDeploy(t *testing.T, root string) []renderedObject {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch d.Name() {
		case "kustomization.yaml", "kustomization.yml", "Kustomization":
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no kustomizations under deploy/")
	}
	sort.Strings(dirs)
	var out []renderedObject
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	for _, dir := range dirs {
		rel, _ := filepath.Rel(root, dir)
		m, err := k.Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", rel, err)
		}
		for _, r := range m.Resources() {
			// Through JSON so numbers are int64/float64 as unstructured expects.
			b, err := r.MarshalJSON()
			if err != nil {
				t.Fatalf("%s: %s: %v", rel, r.CurId(), err)
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(b); err != nil {
				t.Fatalf("%s: %s: %v", rel, r.CurId(), err)
			}
			out = append(out, renderedObject{kustomization: filepath.ToSlash(rel), obj: u})
		}
	}
	return out
}

// checkParsedOnly checks what can be checked of an object no CRD describes.
func checkParsedOnly(t *testing.T, r renderedObject) {
	t.Helper()
	gvk := r.obj.GroupVersionKind()
	if gvk.Group == "" || gvk.Version == "" {
		t.Errorf("%s: apiVersion %q is neither built in nor group/version", r, r.obj.GetAPIVersion())
	}
	if r.obj.GetName() == "" {
		t.Errorf("%s: no metadata.name", r)
	}
	fields, ok := customRequired[gvk.GroupKind()]
	if !ok {
		t.Errorf("%s: %s is not served by kube-apiserver and the test knows no required fields for it: add them to customRequired", r, gvk)
		return
	}
	for _, f := range fields {
		found := false
		for _, alt := range strings.Split(f, "|") {
			if v, ok, _ := unstructured.NestedFieldNoCopy(r.obj.Object, strings.Split(alt, ".")...); ok && v != nil {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: lacks %s", r, strings.ReplaceAll(f, "|", " or "))
		}
	}
}

// warnings collects the apiserver's Warning headers.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// TestDeployDryRun has kube-apiserver on fdb-etcd validate every object of
// deploy/'s kustomizations whose kind it serves: a server-side dry-run
// create with strict field validation runs defaulting, validation and
// admission without storing anything. Other objects (custom resources) are
// only parsed, and the test logs which.
func TestDeployDryRun(t *testing.T) {
	root, err := fdbetcd.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs := renderDeploy(t, root)
	if _, err := fdbetcd.Binary(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	t.Cleanup(func() {
		status := "PASS"
		if t.Failed() {
			status = "FAIL"
		}
		recordScenario("DeployDryRun", storeEmbedded, status, time.Since(start))
	})
	c := startStack(t, storeEmbedded)

	groups, err := restmapper.GetAPIGroupResources(c.client.Discovery())
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	cfg := rest.CopyConfig(c.cfg)
	warn := &warnings{}
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	type served struct {
		renderedObject
		mapping *meta.RESTMapping
	}
	var clusterScoped, namespaced []served
	var parsedOnly []string
	for _, r := range objs {
		gvk := r.obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		switch {
		case meta.IsNoMatchError(err):
			// A built-in kind at a version the apiserver no longer serves
			// is a broken manifest, not a custom resource.
			if ms, _ := mapper.RESTMappings(gvk.GroupKind()); len(ms) > 0 {
				var vs []string
				for _, m := range ms {
					vs = append(vs, m.GroupVersionKind.GroupVersion().String())
				}
				t.Errorf("%s: apiVersion %s is not served; kube-apiserver serves %s at %s", r, r.obj.GetAPIVersion(), gvk.Kind, strings.Join(vs, ", "))
				continue
			}
			checkParsedOnly(t, r)
			parsedOnly = append(parsedOnly, r.String())
		case err != nil:
			t.Errorf("%s: REST mapping of %s: %v", r, gvk, err)
		case m.Scope.Name() == meta.RESTScopeNameNamespace:
			namespaced = append(namespaced, served{r, m})
		default:
			clusterScoped = append(clusterScoped, served{r, m})
		}
	}

	ctx := ctxT(t, 5*time.Minute)
	opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
	var validated []string
	dryRun := func(s served, ri dynamic.ResourceInterface) {
		_, err := ri.Create(ctx, s.obj, opts)
		for _, w := range warn.take() {
			t.Logf("%s: kube-apiserver warns: %s", s, w)
		}
		if err != nil {
			t.Errorf("%s: kube-apiserver rejects it: %v", s, err)
			return
		}
		validated = append(validated, s.String())
	}
	// Cluster-scoped objects (the Namespace among them) first: dry-run
	// create of a Namespace that exists fails as AlreadyExists, and the
	// namespaced objects below need their namespace to exist for real.
	for _, s := range clusterScoped {
		dryRun(s, dyn.Resource(s.mapping.Resource))
	}
	for _, s := range namespaced {
		ns := s.obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault // as kubectl apply -k would
		}
		// A dry-run create into a missing namespace is refused by the
		// NamespaceLifecycle admission plugin.
		ensureNamespace(t, c, ns)
		dryRun(s, dyn.Resource(s.mapping.Resource).Namespace(ns))
	}
	t.Logf("%d objects from %d kustomizations dry-run validated (strict field validation) by %s: %s", len(validated), len(kustomizations(objs)), kubeVersion, strings.Join(validated, "; "))
	t.Logf("only parsed, not dry-run validated (no CRD in kube-apiserver): %s", strings.Join(parsedOnly, "; "))
}

func kustomizations(objs []renderedObject) map[string]bool {
	ks := map[string]bool{}
	for _, r := range objs {
		ks[r.kustomization] = true
	}
	return ks
}
