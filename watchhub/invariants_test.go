package watchhub

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func putAt(key string, rev int64) *Event {
	return newEvent(&mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}})
}

// panics reports whether f panics.
func panics(f func()) (did bool) {
	defer func() { did = recover() != nil }()
	f()
	return false
}

// The race-build checks of a stream's queue take several keys at one
// revision (a transaction) in one response, and refuse a watcher's event
// that repeats, within one response or across two.
func TestCheckEventsRefusesARepeatedEvent(t *testing.T) {
	if !invariants {
		t.Skip("the checks are compiled into race-enabled builds")
	}
	prefix := func() *Watcher { return &Watcher{id: 7, key: []byte("a/"), end: []byte("a0")} }
	a1, a2 := putAt("a/1", 5), putAt("a/2", 5)
	if panics(func() { checkEvents(prefix(), Response{Rev: 5, Events: []*Event{a1, a2}}) }) {
		t.Fatal("two keys of one revision refused")
	}
	if !panics(func() { checkEvents(prefix(), Response{Rev: 5, Events: []*Event{a1, a2, a1}}) }) {
		t.Fatal("an event repeated within one response passed")
	}
	w := prefix()
	checkEvents(w, Response{Rev: 5, Events: []*Event{a1}})
	if !panics(func() { checkEvents(w, Response{Rev: 5, Events: []*Event{a1}}) }) {
		t.Fatal("an event repeated in a second response passed")
	}
}
