package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// kinds maps every kind the manifests may use to its apiVersion and whether
// it is built into Kubernetes (custom resources are only parsed here).
var kinds = map[string]struct {
	apiVersion string
	builtIn    bool
}{
	"Namespace":           {"v1", true},
	"ServiceAccount":      {"v1", true},
	"Service":             {"v1", true},
	"ConfigMap":           {"v1", true},
	"StatefulSet":         {"apps/v1", true},
	"PodDisruptionBudget": {"policy/v1", true},
	"Certificate":         {"cert-manager.io/v1", false},
	"Issuer":              {"cert-manager.io/v1", false},
	"ServiceMonitor":      {"monitoring.coreos.com/v1", false},
	"FoundationDBCluster": {"apps.foundationdb.org/v1beta2", false},
}

// required are the fields each kind must set (dotted paths).
var required = map[string][]string{
	"Service":             {"spec.ports"},
	"StatefulSet":         {"spec.selector.matchLabels", "spec.serviceName", "spec.template.metadata.labels", "spec.template.spec.containers"},
	"PodDisruptionBudget": {"spec.selector.matchLabels"},
	"Certificate":         {"spec.secretName", "spec.issuerRef.name"},
	"ServiceMonitor":      {"spec.selector", "spec.endpoints"},
	"FoundationDBCluster": {"spec.version", "spec.databaseConfiguration.redundancy_mode"},
}

func TestEveryManifestParses(t *testing.T) {
	root := filepath.Join(repoRoot(t), "deploy")
	var parsedOnly []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		docs, err := loadDocs(p)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		for _, d := range docs {
			o, ok := d.(object)
			if !ok {
				continue // a JSON 6902 patch (a list of operations)
			}
			kind := str(o, "kind")
			if kind == "Kustomization" || rel == "compose.yaml" {
				continue
			}
			k, ok := kinds[kind]
			if !ok {
				t.Errorf("%s: unexpected kind %q", rel, kind)
				continue
			}
			if got := str(o, "apiVersion"); got != k.apiVersion {
				t.Errorf("%s: %s has apiVersion %q, want %q", rel, kind, got, k.apiVersion)
			}
			if str(o, "metadata", "name") == "" {
				t.Errorf("%s: %s without metadata.name", rel, kind)
			}
			for _, f := range required[kind] {
				if dig(o, strings.Split(f, ".")...) == nil {
					t.Errorf("%s: %s %s lacks %s", rel, kind, str(o, "metadata", "name"), f)
				}
			}
			if !k.builtIn {
				parsedOnly = append(parsedOnly, rel+": "+kind+"/"+str(o, "metadata", "name"))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(parsedOnly)
	t.Logf("custom resources only parsed and checked for apiVersion, kind and required fields (no CRD validation):\n  %s",
		strings.Join(parsedOnly, "\n  "))
}

func TestKustomizationsBuild(t *testing.T) {
	for _, dir := range kustomizationDirs(t) {
		rel, _ := filepath.Rel(repoRoot(t), dir)
		t.Run(rel, func(t *testing.T) {
			rs, err := build(dir)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, r := range rs {
				if seen[kindName(r.obj)] {
					t.Errorf("%s appears twice", kindName(r.obj))
				}
				seen[kindName(r.obj)] = true
			}
			kubectlAgrees(t, dir, seen)
		})
	}
}

// kubectlAgrees renders the kustomization with the real kustomize when
// kubectl is installed and compares the set of objects.
func kubectlAgrees(t *testing.T, dir string, want map[string]bool) {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl not installed: kustomize rendering checked by the built-in resolver only")
		return
	}
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	got := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^kind: (\S+)\n(?:.*\n)*?metadata:\n(?:  .*\n)*?  name: (\S+)`).FindAllStringSubmatch(string(out), -1) {
		got[m[1]+"/"+m[2]] = true
	}
	for k := range want {
		if !got[k] {
			t.Errorf("kubectl kustomize does not render %s", k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("kubectl kustomize renders %s, which the resolver does not", k)
		}
	}
}

func byKind(rs []resource, kind string) []object {
	var out []object
	for _, r := range rs {
		if str(r.obj, "kind") == kind {
			out = append(out, r.obj)
		}
	}
	return out
}

func one(t *testing.T, rs []resource, kind string) object {
	t.Helper()
	os := byKind(rs, kind)
	if len(os) != 1 {
		t.Fatalf("%d %s objects, want 1", len(os), kind)
	}
	return os[0]
}

// matches reports whether selector (matchLabels-style) selects labels.
func matches(selector, labels any) bool {
	sel, _ := selector.(object)
	lab, _ := labels.(object)
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if lab[k] != v {
			return false
		}
	}
	return true
}

func args(c any) []string {
	var out []string
	for _, a := range list(c, "args") {
		out = append(out, a.(string))
	}
	return out
}

func flagValue(as []string, name string) (string, bool) {
	for _, a := range as {
		if a == "--"+name {
			return "true", true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// checkMember checks the StatefulSet's pod against the Services, volumes,
// probes and the binary's flag parser; it returns the container's args.
func checkMember(t *testing.T, rs []resource) (object, []string) {
	t.Helper()
	sts := one(t, rs, "StatefulSet")
	pod := dig(sts, "spec", "template").(object)
	if !matches(dig(sts, "spec", "selector", "matchLabels"), dig(pod, "metadata", "labels")) {
		t.Error("StatefulSet selector does not select its own pods")
	}
	spec := dig(pod, "spec").(object)
	if dig(spec, "securityContext", "runAsNonRoot") != true {
		t.Error("pod does not require runAsNonRoot")
	}
	if sa := str(spec, "serviceAccountName"); sa != "" {
		found := false
		for _, o := range byKind(rs, "ServiceAccount") {
			found = found || str(o, "metadata", "name") == sa
		}
		if !found {
			t.Errorf("serviceAccountName %s is not deployed", sa)
		}
	}
	volumes := map[string]object{}
	for _, v := range list(spec, "volumes") {
		volumes[str(v, "name")] = v.(object)
	}
	for _, c := range list(sts, "spec", "volumeClaimTemplates") {
		volumes[str(c, "metadata", "name")] = c.(object)
	}
	containers := list(spec, "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers, want 1", len(containers))
	}
	c := containers[0]
	ports := map[string]int{}
	for _, p := range list(c, "ports") {
		ports[str(p, "name")] = dig(p, "containerPort").(int)
	}
	if ports["client"] != 2379 || ports["metrics"] != 2381 {
		t.Errorf("container ports %v, want client 2379 and metrics 2381", ports)
	}
	for _, probe := range []struct{ name, path string }{{"livenessProbe", "/livez"}, {"readinessProbe", "/readyz"}, {"startupProbe", "/livez"}} {
		if p := str(c, probe.name, "httpGet", "path"); p != probe.path {
			t.Errorf("%s path %q, want %s", probe.name, p, probe.path)
		}
		if port := str(c, probe.name, "httpGet", "port"); port != "metrics" {
			t.Errorf("%s on port %q: probes must use the plain-text metrics listener", probe.name, port)
		}
	}
	for _, r := range []string{"cpu", "memory"} {
		if dig(c, "resources", "requests", r) == nil {
			t.Errorf("container requests no %s", r)
		}
	}
	if dig(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Error("container allows privilege escalation")
	}
	mounts := map[string]string{} // mountPath -> volume
	all := append(append([]any{}, list(spec, "initContainers")...), c)
	for i, ctr := range all {
		for _, m := range list(ctr, "volumeMounts") {
			if _, ok := volumes[str(m, "name")]; !ok {
				t.Errorf("container %s mounts undefined volume %s", str(ctr, "name"), str(m, "name"))
			}
			if i == len(all)-1 {
				mounts[str(m, "mountPath")] = str(m, "name")
			}
		}
	}
	as := args(c)
	checkFlags(t, fdbEtcd(t), "StatefulSet", as)
	under := func(flag string) {
		p, ok := flagValue(as, flag)
		if !ok {
			return
		}
		for mp := range mounts {
			if strings.HasPrefix(p, mp+"/") {
				return
			}
		}
		t.Errorf("--%s=%s is not on a mounted volume (%v)", flag, p, mounts)
	}
	for _, f := range []string{"cert-file", "key-file", "trusted-ca-file", "fdb-cluster-file", "data-dir"} {
		under(f)
	}
	if _, ok := flagValue(as, "client-cert-auth"); !ok {
		t.Error("members do not require client certificates")
	}
	if u, _ := flagValue(as, "listen-client-urls"); !strings.HasPrefix(u, "https://") {
		t.Errorf("--listen-client-urls=%s, want https", u)
	}
	// TLS material comes from the cert-manager Certificate's Secret.
	certSecrets := map[string]bool{}
	for _, cert := range byKind(rs, "Certificate") {
		certSecrets[str(cert, "spec", "secretName")] = true
	}
	if tls, ok := volumes[mounts["/etc/fdb-etcd/tls"]]; !ok || !certSecrets[str(tls, "secret", "secretName")] {
		t.Errorf("the TLS volume is not a Secret of a cert-manager Certificate")
	}
	// Services and the PDB select the members; their target ports exist.
	for _, svc := range byKind(rs, "Service") {
		if !matches(dig(svc, "spec", "selector"), dig(pod, "metadata", "labels")) {
			t.Errorf("Service %s does not select the members", str(svc, "metadata", "name"))
		}
		for _, p := range list(svc, "spec", "ports") {
			if _, ok := ports[str(p, "targetPort")]; !ok {
				t.Errorf("Service %s targets unknown port %v", str(svc, "metadata", "name"), dig(p, "targetPort"))
			}
		}
	}
	headless := false
	for _, svc := range byKind(rs, "Service") {
		if str(svc, "metadata", "name") == str(sts, "spec", "serviceName") {
			headless = str(svc, "spec", "clusterIP") == "None"
		}
	}
	if !headless {
		t.Errorf("serviceName %s is not a headless Service", str(sts, "spec", "serviceName"))
	}
	pdb := one(t, rs, "PodDisruptionBudget")
	if !matches(dig(pdb, "spec", "selector", "matchLabels"), dig(pod, "metadata", "labels")) {
		t.Error("PodDisruptionBudget does not select the members")
	}
	if dig(pdb, "spec", "maxUnavailable") == nil && dig(pdb, "spec", "minAvailable") == nil {
		t.Error("PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	return sts, as
}

func TestBase(t *testing.T) {
	root := repoRoot(t)
	rs, err := build(filepath.Join(root, "deploy", "base"))
	if err != nil {
		t.Fatal(err)
	}
	sts, as := checkMember(t, rs)
	if r := dig(sts, "spec", "replicas"); r != 3 {
		t.Errorf("replicas %v, want 3", r)
	}
	if dig(sts, "spec", "template", "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution") == nil {
		t.Error("members may share a node: no required pod anti-affinity")
	}
	if b, _ := flagValue(as, "backend"); b != "fdb" {
		t.Errorf("--backend=%s, want fdb", b)
	}

	// The cluster file comes from the ConfigMap the FoundationDB operator
	// creates for the example cluster: <cluster>-config, key cluster-file.
	fdb, err := build(filepath.Join(root, "deploy", "fdb"))
	if err != nil {
		t.Fatal(err)
	}
	cluster := one(t, fdb, "FoundationDBCluster")
	var cm object
	for _, v := range list(sts, "spec", "template", "spec", "volumes") {
		if dig(v, "configMap") != nil {
			cm = v.(object)
		}
	}
	if str(cm, "configMap", "name") != str(cluster, "metadata", "name")+"-config" ||
		str(cm, "configMap", "items", "0", "key") != "cluster-file" {
		t.Errorf("cluster file volume %v is not the operator's %s-config ConfigMap, key cluster-file", cm, str(cluster, "metadata", "name"))
	}
	dockerArgs, _ := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if v := str(cluster, "spec", "version"); v != dockerArgs["FDB_VERSION"] {
		t.Errorf("FoundationDBCluster version %s, but the image's client library is %s", v, dockerArgs["FDB_VERSION"])
	}

	// cert-manager: issuers exist, the CA issuer's secret is a Certificate's.
	issuers := map[string]object{}
	for _, i := range byKind(rs, "Issuer") {
		issuers[str(i, "metadata", "name")] = i
		spec, _ := dig(i, "spec").(object)
		if spec["selfSigned"] == nil && spec["ca"] == nil && spec["acme"] == nil && spec["vault"] == nil {
			t.Errorf("Issuer %s has no issuer type", str(i, "metadata", "name"))
		}
	}
	secrets := map[string]bool{}
	for _, c := range byKind(rs, "Certificate") {
		secrets[str(c, "spec", "secretName")] = true
		if _, ok := issuers[str(c, "spec", "issuerRef", "name")]; !ok {
			t.Errorf("Certificate %s names missing Issuer %s", str(c, "metadata", "name"), str(c, "spec", "issuerRef", "name"))
		}
		if dig(c, "spec", "dnsNames") == nil && str(c, "spec", "commonName") == "" {
			t.Errorf("Certificate %s has no names", str(c, "metadata", "name"))
		}
	}
	for name, i := range issuers {
		if s := str(i, "spec", "ca", "secretName"); s != "" && !secrets[s] {
			t.Errorf("CA Issuer %s uses secret %s that no Certificate makes", name, s)
		}
	}
	if !secrets["kube-apiserver-etcd-client-tls"] {
		t.Error("no client certificate for kube-apiserver")
	}

	// The ServiceMonitor scrapes a Service's named metrics port.
	sm := one(t, rs, "ServiceMonitor")
	found := false
	for _, svc := range byKind(rs, "Service") {
		if !matches(dig(sm, "spec", "selector", "matchLabels"), dig(svc, "metadata", "labels")) {
			continue
		}
		found = true
		for _, ep := range list(sm, "spec", "endpoints") {
			ok := false
			for _, p := range list(svc, "spec", "ports") {
				ok = ok || str(p, "name") == str(ep, "port")
			}
			if !ok {
				t.Errorf("ServiceMonitor endpoint port %s is not a port of Service %s", str(ep, "port"), str(svc, "metadata", "name"))
			}
		}
	}
	if !found {
		t.Error("ServiceMonitor selects no Service")
	}
}

func TestEmbeddedOverlay(t *testing.T) {
	rs, err := build(filepath.Join(repoRoot(t), "deploy", "overlays", "embedded"))
	if err != nil {
		t.Fatal(err)
	}
	sts, as := checkMember(t, rs)
	if r := dig(sts, "spec", "replicas"); r != 1 {
		t.Errorf("replicas %v, want 1", r)
	}
	if b, _ := flagValue(as, "backend"); b != "pebble" {
		t.Errorf("--backend=%s, want pebble", b)
	}
	dataDir, _ := flagValue(as, "data-dir")
	claims := list(sts, "spec", "volumeClaimTemplates")
	if len(claims) != 1 || dig(claims[0], "spec", "resources", "requests", "storage") == nil {
		t.Fatalf("volumeClaimTemplates %v, want one sized claim", claims)
	}
	mounted := false
	for _, m := range list(sts, "spec", "template", "spec", "containers", "0", "volumeMounts") {
		if str(m, "name") == str(claims[0], "metadata", "name") && strings.HasPrefix(dataDir, str(m, "mountPath")+"/") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("--data-dir=%s is not on the claim", dataDir)
	}
	if list(sts, "spec", "template", "spec", "initContainers") != nil {
		t.Error("the embedded overlay still copies an FDB cluster file")
	}
}

func TestCompose(t *testing.T) {
	docs, err := loadDocs(filepath.Join(repoRoot(t), "deploy", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	services, _ := dig(docs[0], "services").(object)
	for _, s := range []string{"fdb", "fdb-etcd", "kube-apiserver"} {
		if services[s] == nil {
			t.Fatalf("compose.yaml has no %s service", s)
		}
	}
	fe := services["fdb-etcd"]
	if str(fe, "build", "dockerfile") != "Dockerfile" || str(fe, "build", "context") != ".." {
		t.Error("fdb-etcd is not built from the repository's Dockerfile")
	}
	var cmd []string
	for _, a := range list(fe, "command") {
		cmd = append(cmd, a.(string))
	}
	checkFlags(t, fdbEtcd(t), "compose fdb-etcd", cmd)
	if b, _ := flagValue(cmd, "backend"); b != "fdb" {
		t.Errorf("compose fdb-etcd --backend=%s, want fdb", b)
	}
	var api []string
	for _, a := range list(services["kube-apiserver"], "command") {
		api = append(api, a.(string))
	}
	if v, _ := flagValue(api, "etcd-servers"); v != "http://fdb-etcd:2379" {
		t.Errorf("kube-apiserver --etcd-servers=%q, want http://fdb-etcd:2379", v)
	}
	if str(services["kube-apiserver"], "depends_on", "fdb-etcd", "condition") != "service_healthy" {
		t.Error("kube-apiserver does not wait for fdb-etcd's healthcheck")
	}
	fdbImage := str(services["fdb"], "image")
	dockerArgs, _ := parseDockerfile(t, filepath.Join(repoRoot(t), "Dockerfile"))
	if !strings.HasSuffix(fdbImage, ":${FDB_VERSION:-"+dockerArgs["FDB_VERSION"]+"}") {
		t.Errorf("FoundationDB image %s does not default to the image's client version %s", fdbImage, dockerArgs["FDB_VERSION"])
	}
}
