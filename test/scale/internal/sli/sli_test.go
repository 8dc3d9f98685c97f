package sli

import (
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/promtext"
)

func TestSliding(t *testing.T) {
	var ss []Sample
	for _, at := range []time.Duration{0, 15, 30, 45, 60, 75} {
		ss = append(ss, Sample{At: at * time.Second})
	}
	ws := Sliding(ss, 30*time.Second)
	if len(ws) != len(ss)-1 {
		t.Fatalf("%d windows", len(ws))
	}
	// Each window ends at its sample and reaches back at least 30 s, or to
	// the first sample.
	for i, want := range []time.Duration{0, 0, 15, 30, 45} {
		if ws[i].To.At != ss[i+1].At || ws[i].From.At != want*time.Second {
			t.Errorf("window %d: %v..%v, want %v..%v", i, ws[i].From.At, ws[i].To.At, want*time.Second, ss[i+1].At)
		}
	}
}

func TestViewsSelect(t *testing.T) {
	match := map[string]func(promtext.Labels) bool{}
	for _, v := range Views() {
		if v.Match != nil {
			match[v.Key] = v.Match
		}
	}
	for _, c := range []struct {
		key    string
		labels promtext.Labels
		want   bool
	}{
		{MutatingAll, promtext.Labels{"verb": "PUT", "dry_run": ""}, true},
		{MutatingAll, promtext.Labels{"verb": "PUT", "dry_run": "All"}, false},
		{MutatingAll, promtext.Labels{"verb": "WATCH"}, false},
		{MutatingKey("PATCH"), promtext.Labels{"verb": "PATCH"}, true},
		{MutatingKey("PATCH"), promtext.Labels{"verb": "APPLY"}, false},
		{Get, promtext.Labels{"verb": "GET", "scope": "resource"}, true},
		{ListNamespace, promtext.Labels{"verb": "LIST", "scope": "cluster"}, false},
		{ListCluster, promtext.Labels{"verb": "LIST", "scope": "cluster"}, true},
		{Fallbacks, promtext.Labels{"fallback": "skipped"}, true},
		{Fallbacks, promtext.Labels{"fallback": "false"}, false},
		{StorageKey("listStream"), promtext.Labels{"operation": "listStream"}, true},
	} {
		if got := match[c.key](c.labels); got != c.want {
			t.Errorf("%s on %v = %v, want %v", c.key, c.labels, got, c.want)
		}
	}
}
