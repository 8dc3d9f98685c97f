//go:build fdb

package fdb

import (
	"testing"
	"time"
)

func TestVersionWatch(t *testing.T) {
	var w versionWatch
	t0 := time.Unix(1000, 0)
	steps := []struct {
		rv        int64
		at        time.Duration
		recovered bool
		why       string
	}{
		{5_000_000, 0, false, "the first read version says nothing"},
		{6_000_000, time.Second, false, "a second of versions in a second"},
		{5_500_000, 2 * time.Second, false, "an older read version (finished late) says nothing"},
		{66_000_000, time.Minute + time.Second, false, "a minute of idleness"},
		{166_500_000, time.Minute + 2*time.Second, true, "100 M versions in a second: a recovery"},
		{167_000_000, time.Minute + 3*time.Second, false, "back to normal"},
		{217_100_000, time.Minute + 3*time.Second, true, "a 50 M jump at once"},
	}
	for _, s := range steps {
		if got := w.recovered(s.rv, t0.Add(s.at)); got != s.recovered {
			t.Errorf("read version %d at %v: recovered = %v, want %v (%s)", s.rv, s.at, got, s.recovered, s.why)
		}
	}
}
