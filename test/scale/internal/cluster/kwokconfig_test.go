package cluster

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// kwokModule is the sigs.k8s.io/kwok module that tools/kwok pins (go list
// downloads it from the module proxy if it is not in the module cache).
func kwokModule(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok")
	cmd.Dir = "../../tools/kwok"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/kwok in tools/kwok: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestKwokConfig(t *testing.T) {
	b, err := KwokConfig(kwokModule(t), 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	if len(docs) != 1+len(kwokStages) {
		t.Fatalf("%d documents, want %d:\n%s", len(docs), 1+len(kwokStages), b)
	}
	names := map[string]bool{}
	for i, d := range docs {
		js, err := yaml.YAMLToJSON([]byte(d))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if i == 0 {
			if u.GetKind() != "KwokConfiguration" {
				t.Errorf("first document is a %s", u.GetKind())
			}
			continue
		}
		if u.GetKind() != "Stage" {
			t.Errorf("document %d is a %s", i, u.GetKind())
		}
		names[u.GetName()] = true
		if u.GetName() == heartbeatStage {
			d, _, _ := unstructured.NestedInt64(u.Object, "spec", "delay", "durationMilliseconds")
			j, _, _ := unstructured.NestedInt64(u.Object, "spec", "delay", "jitterDurationMilliseconds")
			if d != 90000 || j != 99000 {
				t.Errorf("heartbeat delay %d ms, jitter to %d ms; want 90000, 99000", d, j)
			}
		}
		if _, ok, _ := unstructured.NestedMap(u.Object, "spec", "next"); !ok {
			t.Errorf("stage %s lost spec.next", u.GetName())
		}
	}
	for _, want := range []string{"node-initialize", heartbeatStage, "pod-ready", "pod-complete", "pod-delete"} {
		if !names[want] {
			t.Errorf("no stage %s in %v", want, names)
		}
	}
}

func TestKwokConfigMissingStages(t *testing.T) {
	if _, err := KwokConfig(t.TempDir(), time.Minute); err == nil {
		t.Error("no error for a directory without kwok's stages")
	}
}
