package mvcc

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// The checks below run only when invariants is set (race-enabled builds).
// A violation panics: a reader was handed a revision newer than the header
// it answers with, so a watcher or a client resuming from that header would
// see the same change twice or skip one.

// checkEventsAtOrBelow: every revision and event a log read returns is at
// or below the head it reports.
func checkEventsAtOrBelow(head int64, revs []RevisionEvents) {
	for _, r := range revs {
		if r.Rev > head {
			panic(fmt.Sprintf("mvcc: revision %d returned with head %d", r.Rev, head))
		}
		for _, ev := range r.Events {
			if ev.Kv != nil && ev.Kv.ModRevision > head {
				panic(fmt.Sprintf("mvcc: event of %q at revision %d returned with head %d", ev.Kv.Key, ev.Kv.ModRevision, head))
			}
		}
	}
}

// checkWatchBatch: a watch-log read returns each revision of From..To at
// most once, in order, each event at its revision's number and no key
// twice in one revision.
func checkWatchBatch(b EventBatch) {
	last := b.From - 1
	for _, r := range b.Revs {
		if r.Rev <= last || r.Rev > b.To {
			panic(fmt.Sprintf("mvcc: revision %d returned after %d in a batch of %d..%d", r.Rev, last, b.From, b.To))
		}
		last = r.Rev
		keys := make(map[string]bool, len(r.Events))
		for _, ev := range r.Events {
			if ev.Kv == nil {
				continue
			}
			if ev.Kv.ModRevision != r.Rev || keys[string(ev.Kv.Key)] {
				panic(fmt.Sprintf("mvcc: event of %q at revision %d in revision %d, or twice", ev.Kv.Key, ev.Kv.ModRevision, r.Rev))
			}
			keys[string(ev.Kv.Key)] = true
		}
	}
}

// checkRangeHeader: every key a Range returns was written at or below the
// response header's revision.
func checkRangeHeader(resp *pb.RangeResponse) {
	if resp == nil || resp.Header == nil {
		return
	}
	for _, kv := range resp.Kvs {
		if kv.ModRevision > resp.Header.Revision {
			panic(fmt.Sprintf("mvcc: key %q at revision %d returned with header revision %d", kv.Key, kv.ModRevision, resp.Header.Revision))
		}
	}
}

// checkTailRead: what the log's tail in memory answered for r (b) is what
// storage holds for the same revisions, event for event. A read of storage
// that fails (a compaction since, the caller gone) checks nothing; at a
// revision a compaction has reached since, storage may have lost the
// previous version the tail still has, and only the rest is compared.
func (s *Store) checkTailRead(ctx context.Context, r WatchRead, b EventBatch) {
	r.UpTo = b.To
	got, err := s.readWatchEvents(ctx, r)
	if err != nil {
		return
	}
	for i := range min(len(got.Revs), len(b.Revs)) {
		mem, st := b.Revs[i], got.Revs[i]
		if mem.Rev != st.Rev || len(mem.Events) != len(st.Events) {
			panic(fmt.Sprintf("mvcc: the log's tail has revision %d with %d events, storage %d with %d", mem.Rev, len(mem.Events), st.Rev, len(st.Events)))
		}
		for j := range mem.Events {
			m, o := mem.Events[j], st.Events[j]
			if mem.Rev <= got.Compacted {
				m, o = withoutPrev(m), withoutPrev(o)
			}
			if !proto.Equal(m, o) {
				panic(fmt.Sprintf("mvcc: the log's tail has, at revision %d, event %v; storage %v (read %+v)", mem.Rev, mem.Events[j], st.Events[j], r))
			}
		}
	}
}

// withoutPrev is ev without its previous version, for comparing events at a
// compacted revision.
func withoutPrev(ev *mvccpb.Event) *mvccpb.Event {
	return &mvccpb.Event{Type: ev.Type, Kv: ev.Kv}
}
