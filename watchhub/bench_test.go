package watchhub

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/mvcc"
)

// BenchmarkDispatch measures the hub's cost to fan one single-event
// revision out to 10,000 prefix watchers spread over 100 streams (the
// queues are drained inline, outside the timing of the send path).
func BenchmarkDispatch(b *testing.B) {
	for _, tc := range []struct {
		name     string
		watchers int
		distinct bool
	}{{"10k-same-prefix", 10_000, false}, {"10k-distinct-prefixes", 10_000, true}, {"100", 100, false}} {
		b.Run(tc.name, func(b *testing.B) {
			h := &Hub{cfg: Config{}, idx: newIndex(true), streams: map[*Stream]struct{}{}, waiting: map[*Stream]struct{}{}, advanced: make(chan struct{})}
			h.cfg.defaults()
			var streams []*Stream
			for range 100 {
				streams = append(streams, &Stream{h: h, watchers: map[int64]*Watcher{}, unsynced: map[*Watcher]struct{}{}, queue: newQueue(h.cfg)})
			}
			for i := range tc.watchers {
				st := streams[i%len(streams)]
				key := "/registry/pods/"
				if tc.distinct {
					key = fmt.Sprintf("/registry/pods/ns%d/", i)
				}
				w := &Watcher{st: st, id: int64(i), key: []byte(key), end: prefixEnd([]byte(key)), next: 1}
				st.watchers[w.id] = w
				h.idx.add(w)
			}
			ev := &mvccpb.Event{Type: mvccpb.Event_PUT, Kv: &mvccpb.KeyValue{Key: []byte("/registry/pods/ns7/p"), Value: make([]byte, 256)}}
			buf := make([]Response, 0, 4096)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				ev := &mvccpb.Event{Type: ev.Type, Kv: &mvccpb.KeyValue{Key: ev.Kv.Key, Value: ev.Kv.Value, ModRevision: int64(i + 2)}}
				re := &revEvents{rev: int64(i + 2), full: []*Event{newEvent(ev)}}
				h.mu.Lock()
				h.dispatch(re)
				h.mu.Unlock()
				b.StopTimer()
				for _, st := range streams {
					buf = st.Pop(buf[:0], 4096)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkDeliverOwnCommit measures, on the test backend
// (FDB_ETCD_TEST_BACKEND), a put's delivery through the hub of the same
// process: the time from the put's return to its event in a stream's
// queue (deliver-ms), one put at a time, as a write owner delivers the
// writes it commits itself.
func BenchmarkDeliverOwnCommit(b *testing.B) {
	s, err := mvcc.Open(testdb.Open(b), mvcc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	h, err := New(context.Background(), s, Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st := h.NewStream()
	defer st.Close()
	if err := st.Watch(ctx, Options{Key: []byte("k")}); err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	var buf []Response
	for i := range b.N {
		if err := h.WaitCaughtUp(ctx); err != nil {
			b.Fatal(err)
		}
		buf = st.Pop(buf[:0], 64) // the created response
		resp, err := s.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
		if err != nil {
			b.Fatal(err)
		}
		put := time.Now()
		for delivered := false; !delivered; {
			select {
			case <-st.Ready():
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			}
			buf = st.Pop(buf[:0], 64)
			for _, r := range buf {
				delivered = delivered || r.Kind == KindEvents && r.Rev == resp.Header.Revision
			}
		}
		total += time.Since(put)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "deliver-ms")
}
