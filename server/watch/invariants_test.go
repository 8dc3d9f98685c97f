package watch

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/watchhub"
)

func panics(f func()) (did bool) {
	defer func() { did = recover() != nil }()
	f()
	return false
}

// The sender's race-build check refuses a watcher's event that repeats,
// within one response or across two, and starts afresh for a watch id that
// is created again.
func TestSenderRefusesARepeatedEvent(t *testing.T) {
	if !invariants {
		t.Skip("the checks are compiled into race-enabled builds")
	}
	ev := func(key string, rev int64) *watchhub.Event {
		return &watchhub.Event{PB: &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}}
	}
	events := func(evs ...*watchhub.Event) *watchhub.Response {
		return &watchhub.Response{Kind: watchhub.KindEvents, WatchID: 1, Rev: 9, Events: evs}
	}
	a, b := ev("a", 5), ev("b", 5)
	s := sentEvents{}
	if panics(func() { s.check(events(a, b)) }) {
		t.Fatal("two keys of one revision refused")
	}
	if panics(func() { s.check(events(ev("c", 6))) }) {
		t.Fatal("a newer event refused")
	}
	if !panics(func() { s.check(events(ev("c", 6))) }) {
		t.Fatal("an event repeated in a second response passed")
	}
	if !panics(func() { s.check(events(a)) }) {
		t.Fatal("an older event in a later response passed")
	}
	if !panics(func() { sentEvents{}.check(events(a, b, a)) }) {
		t.Fatal("an event repeated within one response passed")
	}
	s.check(&watchhub.Response{Kind: watchhub.KindCreated, WatchID: 1})
	if panics(func() { s.check(events(a)) }) {
		t.Fatal("a watch id created again kept what its predecessor was sent")
	}
}
