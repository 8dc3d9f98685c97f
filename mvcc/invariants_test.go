package mvcc

import (
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestDomainErrorWrapped: a request-level error keeps its class when a
// layer wraps it, so it reaches the client instead of retrying the batch.
func TestDomainErrorWrapped(t *testing.T) {
	for _, err := range []error{ErrCompacted, ErrFutureRev, ErrKeyNotFound, ErrLeaseNotFound, ErrRequestTooLarge} {
		if w := fmt.Errorf("txn op 3: %w", err); !domainError(w) {
			t.Errorf("%v not classified as a domain error", w)
		}
	}
	if domainError(fmt.Errorf("read: %w", ErrStopped)) {
		t.Error("ErrStopped classified as a domain error")
	}
}

// TestHeaderChecks: the read-path checks panic on a revision above the
// header and pass everything at or below it.
func TestHeaderChecks(t *testing.T) {
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	ev := func(rev int64) *mvccpb.Event {
		return &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: rev}}
	}
	checkEventsAtOrBelow(5, []RevisionEvents{{Rev: 4, Events: []*mvccpb.Event{ev(4)}}, {Rev: 5, Events: []*mvccpb.Event{ev(5)}}})
	panics("revision above head", func() { checkEventsAtOrBelow(5, []RevisionEvents{{Rev: 6}}) })
	panics("event above head", func() { checkEventsAtOrBelow(5, []RevisionEvents{{Rev: 5, Events: []*mvccpb.Event{ev(6)}}}) })
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 5}, Kvs: []*mvccpb.KeyValue{{Key: []byte("k"), ModRevision: 5}}}
	checkRangeHeader(resp)
	resp.Kvs[0].ModRevision = 6
	panics("key above header", func() { checkRangeHeader(resp) })
}
