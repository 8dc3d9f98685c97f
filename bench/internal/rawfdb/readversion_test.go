package rawfdb

import (
	"errors"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestRecentVersionReusesUntilMaxAge(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	next := int64(100)
	fail := error(nil)
	r := NewRecentVersion(func() (int64, error) {
		if fail != nil {
			return 0, fail
		}
		next++
		clock.advance(time.Millisecond) // a read version takes a while
		return next, nil
	}, 50*time.Millisecond, clock.now)

	steps := []struct {
		advance time.Duration
		want    int64
	}{
		{0, 101},                     // none yet: fetched
		{10 * time.Millisecond, 101}, // 11 ms old: reused
		{38 * time.Millisecond, 101}, // 49 ms since asked for: reused
		{time.Millisecond, 102},      // 50 ms since asked for (not since received): fetched
		{48 * time.Millisecond, 102}, // 49 ms since asked for
	}
	for i, s := range steps {
		clock.advance(s.advance)
		v, err := r.Get()
		if err != nil || v != s.want {
			t.Fatalf("step %d: Get = %d, %v; want %d", i, v, err, s.want)
		}
	}
	if n := r.Fetches(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
	fail = errors.New("unreachable")
	clock.advance(time.Second)
	if _, err := r.Get(); !errors.Is(err, fail) {
		t.Fatalf("Get after a failed fetch: %v, want %v", err, fail)
	}
	fail = nil
	if v, err := r.Get(); err != nil || v != 103 {
		t.Fatalf("Get after recovery = %d, %v; want 103", v, err)
	}
}
