package workload

import "testing"

// TestConnsSpreadReplicas checks the promise RunLoad relies on: worker w on
// connection w mod Conns lands on replica w mod replicas.
func TestConnsSpreadReplicas(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		env := &Env{Endpoints: make([]string, replicas), P: Params{Conns: 8}}
		for _, workers := range []int{1, 2, 16, 256} {
			conns := env.Conns(workers)
			if conns < 1 || conns > workers {
				t.Fatalf("%d replicas, %d workers: %d conns", replicas, workers, conns)
			}
			per := make([]int, replicas)
			for w := 0; w < workers; w++ {
				r := (w % conns) % replicas // Clients: client i is on replica i mod replicas
				if r != w%replicas {
					t.Fatalf("%d replicas, %d workers, %d conns: worker %d on replica %d", replicas, workers, conns, w, r)
				}
				per[r]++
			}
			if workers >= replicas && per[0]-per[replicas-1] > 1 {
				t.Errorf("%d replicas, %d workers: uneven %v", replicas, workers, per)
			}
		}
	}
}

// TestRawEquivalents: every row says what the plain FoundationDB client does
// for it, or why nothing; the write rows, and only they, can be batched.
func TestRawEquivalents(t *testing.T) {
	writes := map[string]bool{"put": true, "txn": true, "lease": true}
	none := map[string]bool{"progress": true, "rss": true, "noisy": true, "large": true}
	for _, w := range All(Full()) {
		rw, ok := w.(RawEquivalent)
		if !ok {
			t.Errorf("%s: no Raw", w.Name())
			continue
		}
		s := rw.Raw(Full())
		switch {
		case none[w.Group()]:
			if s.Op != "" || s.None == "" {
				t.Errorf("%s: %+v, want no equivalent with a reason", w.Name(), s)
			}
			continue
		case s.Op == "" || s.Prefix == "":
			t.Errorf("%s: %+v, want an operation on a prefix", w.Name(), s)
		}
		if s.Batchable != writes[w.Group()] {
			t.Errorf("%s: batchable %v, want %v", w.Name(), s.Batchable, writes[w.Group()])
		}
	}
}
