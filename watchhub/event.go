package watchhub

import (
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// eventsField is the field number of WatchResponse.events.
var eventsField = (&pb.WatchResponse{}).ProtoReflect().Descriptor().Fields().ByName("events").Number()

// Event is one event as every watcher that gets it shares it: the hub never
// copies an event per watcher, and its wire encoding (as a WatchResponse
// events field) is computed once, by whichever sender needs it first.
type Event struct {
	PB   *mvccpb.Event
	size int // approximate bytes, for the stream queue's budget

	once sync.Once
	wire []byte
}

func newEvent(ev *mvccpb.Event) *Event {
	n := 64
	if ev.Kv != nil {
		n += len(ev.Kv.Key) + len(ev.Kv.Value)
	}
	if ev.PrevKv != nil {
		n += len(ev.PrevKv.Key) + len(ev.PrevKv.Value)
	}
	return &Event{PB: ev, size: n}
}

// Wire returns the event encoded as one WatchResponse events field (tag,
// length, message). The bytes are shared and must not be modified.
func (e *Event) Wire() []byte {
	e.once.Do(func() {
		m, err := proto.Marshal(e.PB)
		if err != nil {
			panic("watchhub: marshal event: " + err.Error())
		}
		b := make([]byte, 0, len(m)+protowire.SizeTag(eventsField)+protowire.SizeVarint(uint64(len(m))))
		b = protowire.AppendTag(b, eventsField, protowire.BytesType)
		e.wire = protowire.AppendBytes(b, m)
	})
	return e.wire
}

// Rev is the event's revision.
func (e *Event) Rev() int64 { return e.PB.Kv.ModRevision }

// revEvents is one revision's events in the two shapes watchers take: full
// (with PrevKv where the key existed) and bare (without PrevKv), the bare
// shape built lazily and only for events that have a PrevKv. A revEvents is
// used by one goroutine at a time (the hub under its lock, or one stream's
// catch-up), so the lazy fields need no locking.
type revEvents struct {
	rev     int64
	prevKV  bool // read with previous values
	full    []*Event
	bare    []*Event // nil until needed; bare[i] == nil until built
	bareAll bool
}

// revEventsOf wraps a batch read from the store. An event at the compaction
// revision loses its PrevKv, because etcd reads prev_kv at rev-1, which is
// compacted.
func revEventsOf(b mvcc.EventBatch) []*revEvents {
	out := make([]*revEvents, 0, len(b.Revs))
	for _, re := range b.Revs {
		r := &revEvents{rev: re.Rev, prevKV: b.PrevKV, full: make([]*Event, len(re.Events))}
		for i, ev := range re.Events {
			if re.Rev <= b.Compacted {
				ev.PrevKv = nil
			}
			r.full[i] = newEvent(ev)
		}
		out = append(out, r)
	}
	return out
}

func (r *revEvents) bareAt(i int) *Event {
	e := r.full[i]
	if e.PB.PrevKv == nil {
		return e
	}
	if r.bare == nil {
		r.bare = make([]*Event, len(r.full))
	}
	if r.bare[i] == nil {
		r.bare[i] = newEvent(&mvccpb.Event{Type: e.PB.Type, Kv: e.PB.Kv})
	}
	return r.bare[i]
}

func (r *revEvents) at(i int, prevKV bool) *Event {
	if prevKV {
		return r.full[i]
	}
	return r.bareAt(i)
}

// pick returns the events at hits, sharing the revision's own slice when a
// watcher gets all of them.
func (r *revEvents) pick(hits []int32, prevKV bool) []*Event {
	if len(hits) == len(r.full) {
		if prevKV {
			return r.full
		}
		if !r.bareAll {
			for i := range r.full {
				r.bareAt(i)
			}
			r.bareAll = true
			if r.bare == nil { // no event had a PrevKv
				r.bare = r.full
			} else {
				for i, e := range r.bare {
					if e == nil {
						r.bare[i] = r.full[i]
					}
				}
			}
		}
		return r.bare
	}
	out := make([]*Event, len(hits))
	for j, i := range hits {
		out[j] = r.at(int(i), prevKV)
	}
	return out
}

func eventsSize(evs []*Event) int {
	n := 0
	for _, e := range evs {
		n += e.size
	}
	return n
}
