package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// kwokStages are the Stage files of kwok's own module that play the kubelet
// (paths below its kustomize/stage/): nodes become Ready and heart-beat
// their status, pods become Running and go away once deleted.
var kwokStages = []string{
	"node/fast/node-initialize.yaml",
	"node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"pod/fast/pod-ready.yaml",
	"pod/fast/pod-complete.yaml",
	"pod/fast/pod-delete.yaml",
}

// heartbeatStage is the stage whose delay is the node status interval.
const heartbeatStage = "node-heartbeat-with-lease"

// KwokConfig builds kwok's configuration: worker counts large enough that
// kwok is not what limits the churn, and the stages read from kwokModDir
// (the sigs.k8s.io/kwok module the kwok binary was built from) with the
// node status heartbeat every statusInterval (plus up to 10 % jitter).
func KwokConfig(kwokModDir string, statusInterval time.Duration) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 8
  nodeLeaseParallelism: 16
`)
	for _, rel := range kwokStages {
		raw, err := os.ReadFile(filepath.Join(kwokModDir, "kustomize", "stage", rel))
		if err != nil {
			return nil, fmt.Errorf("kwok stage: %w", err)
		}
		doc, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("kwok stage %s: %w", rel, err)
		}
		var st unstructured.Unstructured
		if err := st.UnmarshalJSON(doc); err != nil {
			return nil, fmt.Errorf("kwok stage %s: %w", rel, err)
		}
		if st.GetName() == heartbeatStage {
			ms := statusInterval.Milliseconds()
			if err := unstructured.SetNestedField(st.Object, ms, "spec", "delay", "durationMilliseconds"); err != nil {
				return nil, err
			}
			if err := unstructured.SetNestedField(st.Object, ms+ms/10, "spec", "delay", "jitterDurationMilliseconds"); err != nil {
				return nil, err
			}
		}
		js, err := st.MarshalJSON()
		if err != nil {
			return nil, err
		}
		out, err := yaml.JSONToYAML(js)
		if err != nil {
			return nil, err
		}
		b.WriteString("---\n")
		b.Write(out)
	}
	return b.Bytes(), nil
}
