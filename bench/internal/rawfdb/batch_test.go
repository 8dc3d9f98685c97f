package rawfdb

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type req struct {
	id, size int
}

func (r req) Size() int { return r.size }

// gatedCommit records every batch and holds every commit until the gate is
// closed, so that the test can queue requests behind the first one.
type gatedCommit struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{} // commits wait until it is closed
	fail    map[int]error // by batch index
}

func newGated() *gatedCommit { return &gatedCommit{gate: make(chan struct{})} }

func (g *gatedCommit) commit(batch []req) error {
	<-g.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]int, len(batch))
	for i, r := range batch {
		ids[i] = r.id
	}
	g.batches = append(g.batches, ids)
	return g.fail[len(g.batches)-1]
}

func (g *gatedCommit) recorded() [][]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.batches)
}

// queued waits until a commit is in flight (its leader has taken its
// batch) and n requests are queued behind it.
func queued[R Sized](t *testing.T, b *Batcher[R], n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b.mu.Lock()
		got, leading := len(b.waiting), b.leading
		b.mu.Unlock()
		if leading && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBatcherLoneRequestCommitsAtOnce(t *testing.T) {
	g := newGated()
	close(g.gate)
	b := NewBatcher(16, 1<<20, g.commit)
	if err := b.Do(req{id: 1, size: 10}); err != nil {
		t.Fatal(err)
	}
	if got := g.recorded(); len(got) != 1 || !slices.Equal(got[0], []int{1}) {
		t.Fatalf("batches %v, want [[1]]", got)
	}
}

// TestBatcherQueuesBehindCommit: requests that arrive while a commit is in
// flight all go into the next transaction, which the oldest of them leads.
func TestBatcherQueuesBehindCommit(t *testing.T) {
	g := newGated()
	b := NewBatcher(16, 1<<20, g.commit)
	var wg sync.WaitGroup
	do := func(id int) {
		defer wg.Done()
		if err := b.Do(req{id: id, size: 10}); err != nil {
			t.Error(err)
		}
	}
	wg.Add(1)
	go do(0)
	queued(t, b, 0) // request 0 leads and sits in commit
	for id := 1; id <= 5; id++ {
		wg.Add(1)
		go do(id)
	}
	queued(t, b, 5)
	close(g.gate)
	wg.Wait()
	got := g.recorded()
	if len(got) != 2 || !slices.Equal(got[0], []int{0}) || len(got[1]) != 5 {
		t.Fatalf("batches %v, want [[0] [five others]]", got)
	}
	second := slices.Sorted(slices.Values(got[1]))
	if !slices.Equal(second, []int{1, 2, 3, 4, 5}) {
		t.Fatalf("second batch %v, want requests 1-5", got[1])
	}
	if batches, requests := b.Stats(); batches != 2 || requests != 6 {
		t.Fatalf("stats %d batches %d requests, want 2 and 6", batches, requests)
	}
}

// TestBatcherBounds: a queue longer than the bounds is committed in several
// batches, each within maxBatch requests and maxBytes bytes (a single larger
// request still goes alone).
func TestBatcherBounds(t *testing.T) {
	for _, tc := range []struct {
		name              string
		maxBatch, maxByte int
		sizes             []int
		want              []int // batch sizes after the first
	}{
		{"count", 4, 1 << 20, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []int{4, 4, 2}},
		{"bytes", 100, 25, []int{10, 10, 10, 10, 30, 10}, []int{2, 2, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGated()
			b := NewBatcher(tc.maxBatch, tc.maxByte, g.commit)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); b.Do(req{id: -1, size: 1}) }()
			queued(t, b, 0)
			// Queue in a known order: each waits until the previous is queued.
			for i, s := range tc.sizes {
				wg.Add(1)
				go func() { defer wg.Done(); b.Do(req{id: i, size: s}) }()
				queued(t, b, i+1)
			}
			close(g.gate)
			wg.Wait()
			got := g.recorded()[1:]
			var sizes []int
			next := 0
			for _, batch := range got {
				sizes = append(sizes, len(batch))
				for _, id := range batch {
					if id != next {
						t.Fatalf("batches %v: not in arrival order", got)
					}
					next++
				}
			}
			if !slices.Equal(sizes, tc.want) {
				t.Fatalf("batch sizes %v, want %v", sizes, tc.want)
			}
		})
	}
}

// TestBatcherErrorReachesItsBatchOnly: a failed commit fails every request
// it carried and none of the next batch.
func TestBatcherErrorReachesItsBatchOnly(t *testing.T) {
	boom := errors.New("boom")
	g := newGated()
	g.fail = map[int]error{1: boom}
	b := NewBatcher(2, 1<<20, g.commit)
	errs := make([]error, 5)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = b.Do(req{id: 0}) }()
	queued(t, b, 0)
	for i := 1; i < 5; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = b.Do(req{id: i}) }()
		queued(t, b, i)
	}
	close(g.gate)
	wg.Wait()
	want := []error{nil, boom, boom, nil, nil}
	for i := range want {
		if !errors.Is(errs[i], want[i]) || (want[i] == nil && errs[i] != nil) {
			t.Fatalf("request %d: %v, want %v (batches %v)", i, errs[i], want[i], g.recorded())
		}
	}
}

// TestBatcherConcurrent: under many concurrent callers every request is
// committed exactly once and commits never overlap.
func TestBatcherConcurrent(t *testing.T) {
	var seen sync.Map
	var inflight atomic.Int32
	b := NewBatcher(8, 1<<20, func(batch []req) error {
		if inflight.Add(1) > 1 {
			t.Error("two commits ran at once")
		}
		defer inflight.Add(-1)
		for _, r := range batch {
			if _, dup := seen.LoadOrStore(r.id, true); dup {
				t.Errorf("request %d committed twice", r.id)
			}
		}
		return nil
	})
	const workers, each = 32, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := b.Do(req{id: w*each + i, size: 1}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if _, requests := b.Stats(); requests != workers*each {
		t.Fatalf("%d requests committed, want %d", requests, workers*each)
	}
}
