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
