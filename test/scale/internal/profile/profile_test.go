package profile

import "testing"

func TestInformerMix(t *testing.T) {
	for _, n := range []int{1, 40, 200, 1000} {
		m := InformerMix(n)
		if sum := m.PodsByNode + m.PodsAll + m.EndpointSlices + m.ConfigMaps; sum != n || m.PodsAll < 1 {
			t.Errorf("InformerMix(%d) = %+v (sum %d)", n, m, sum)
		}
	}
	if m := InformerMix(200); m != (Mix{PodsByNode: 140, PodsAll: 2, EndpointSlices: 30, ConfigMaps: 28}) {
		t.Errorf("InformerMix(200) = %+v", m)
	}
}

func TestDeployments(t *testing.T) {
	r := &Run{cfg: Config{Pods: 250, PodsPerDeployment: 100, Namespaces: 2}}
	deps := r.deployments()
	if len(deps) != 3 || deps[2].replicas != 50 || deps[1].namespace != appNamespace(1) || deps[2].namespace != appNamespace(0) {
		t.Errorf("deployments: %+v", deps)
	}
}
