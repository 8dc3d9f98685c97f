package watch

import (
	"testing"

	"github.com/fdb-etcd/fdb-etcd/watchhub"
)

func TestCoalesceKeepsOrderAcrossControlResponses(t *testing.T) {
	ev := func(id, rev int64) watchhub.Response {
		return watchhub.Response{Kind: watchhub.KindEvents, WatchID: id, Rev: rev, Events: make([]*watchhub.Event, 1)}
	}
	progress := watchhub.Response{Kind: watchhub.KindProgress, WatchID: -1, Rev: 3}
	in := []watchhub.Response{ev(1, 2), ev(2, 2), ev(1, 3), ev(2, 3), progress, ev(1, 4), ev(1, 5)}
	out := coalesce(in)
	want := []struct {
		kind   watchhub.Kind
		id     int64
		rev    int64
		events int
	}{
		{watchhub.KindEvents, 1, 3, 2},
		{watchhub.KindEvents, 2, 3, 2},
		{watchhub.KindProgress, -1, 3, 0},
		{watchhub.KindEvents, 1, 5, 2},
	}
	if len(out) != len(want) {
		t.Fatalf("got %d responses, want %d", len(out), len(want))
	}
	for i, w := range want {
		if out[i].Kind != w.kind || out[i].WatchID != w.id || out[i].Rev != w.rev || len(out[i].Events) != w.events {
			t.Fatalf("response %d = %+v, want %+v", i, out[i], w)
		}
	}
}

// The hub shares one revision's Events slice among every watcher that gets
// it, so merging must never write into a shared slice's spare capacity, and
// a long backlog must come out whole and in revision order.
func TestCoalesceLeavesSharedEventsAloneAndKeepsOrder(t *testing.T) {
	events := make([]*watchhub.Event, 0, 400)
	for range 400 {
		events = append(events, &watchhub.Event{})
	}
	shared := make([]*watchhub.Event, 1, 8) // spare capacity a careless append would use
	shared[0] = events[0]
	in := []watchhub.Response{
		{Kind: watchhub.KindEvents, WatchID: 1, Rev: 1, Events: shared},
		{Kind: watchhub.KindEvents, WatchID: 2, Rev: 1, Events: shared},
	}
	for i := 1; i < len(events); i++ {
		in = append(in, watchhub.Response{Kind: watchhub.KindEvents, WatchID: 1, Rev: int64(i + 1), Events: events[i : i+1 : i+1]})
	}
	out := coalesce(in)
	if len(out) != 2 {
		t.Fatalf("got %d responses, want 2", len(out))
	}
	if got := shared[:2][1]; got != nil {
		t.Fatalf("merge wrote into the shared slice's spare capacity")
	}
	if len(out[1].Events) != 1 || out[1].Events[0] != events[0] {
		t.Fatalf("watcher 2's events changed: %d events", len(out[1].Events))
	}
	if out[0].Rev != int64(len(events)) || len(out[0].Events) != len(events) {
		t.Fatalf("watcher 1: rev %d with %d events, want rev %d with %d", out[0].Rev, len(out[0].Events), len(events), len(events))
	}
	for i, e := range out[0].Events {
		if e != events[i] {
			t.Fatalf("watcher 1's event %d out of order", i)
		}
	}
}

// A stream that fell 1,000 revisions behind on 100 watchers.
func BenchmarkCoalesceBacklog(b *testing.B) {
	ev := []*watchhub.Event{{}}
	in := make([]watchhub.Response, 0, 100_000)
	for rev := range 1000 {
		for id := range 100 {
			in = append(in, watchhub.Response{Kind: watchhub.KindEvents, WatchID: int64(id), Rev: int64(rev + 1), Events: ev})
		}
	}
	rs := make([]watchhub.Response, len(in))
	for b.Loop() {
		copy(rs, in)
		if out := coalesce(rs); len(out) != 100 {
			b.Fatalf("got %d responses", len(out))
		}
	}
}
