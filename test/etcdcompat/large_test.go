package etcdcompat

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

var flagLargeKeys = flag.Int("large-keys", 0, "keys of TestLargeDeleteCompat (0: 60,000, or 200,000 with ETCDCOMPAT_LONG=1)")

// envLong runs the long variants: the large delete with 200,000 keys.
const envLong = "ETCDCOMPAT_LONG"

// largeTimeout bounds one large request: etcd deletes 200,000 keys in about
// a second, fdb-etcd stages them in several transactions.
const largeTimeout = 3 * time.Minute

// TestLargeDeleteCompat deletes a prefix of many keys (etcdctl del
// --prefix) and revokes a lease holding many keys, on etcd and on fdb-etcd,
// which cannot commit either in one FoundationDB transaction and stages
// them. Both must answer the same (deleted count, revision bump: one
// revision each), show the same state before and after, and send a watcher
// of the prefix the same delete events, with prev_kv, at one revision in
// the same number of responses.
func TestLargeDeleteCompat(t *testing.T) {
	t.Parallel()
	n := *flagLargeKeys
	switch {
	case n > 0:
	case os.Getenv(envLong) != "":
		n = 200_000
	default:
		n = 60_000
	}
	p := startPair(t)
	const lease = 4242
	for _, s := range []*server{p.ref, p.cand} {
		ctx, cancel := context.WithTimeout(context.Background(), largeTimeout)
		if _, err := s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: lease, TTL: 3600}); err != nil {
			t.Fatalf("%s: grant: %v", s.name, err)
		}
		cancel()
	}
	start := time.Now()
	fillCompat(t, p, "big/", n, 0)
	fillCompat(t, p, "leased/", n/4, lease)
	p.check(t, "neighbours", &pb.PutRequest{Key: []byte("big0"), Value: []byte("after the range")})
	p.check(t, "neighbours", &pb.PutRequest{Key: []byte("bif"), Value: []byte("before the range")})
	t.Logf("filled %d + %d keys on both in %v", n, n/4, time.Since(start))
	base := p.refRev(t)

	watches := map[string]*watchStream{}
	for _, s := range []*server{p.ref, p.cand} {
		w := openWatch(s)
		defer w.close()
		w.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte("b"), RangeEnd: []byte("m"), StartRevision: base + 1, PrevKv: true}}})
		watches[s.name] = w
	}
	for _, req := range []any{
		&pb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0")},
		&pb.LeaseRevokeRequest{ID: lease},
		&pb.DeleteRangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0")}, // nothing left: no revision
	} {
		o := p.execLarge(req)
		if !o.equal() {
			t.Fatal(p.mismatch("large request", o))
		}
		t.Logf("%s: %s", reqStrLarge(req), o.ref)
	}
	p.check(t, "count before", &pb.RangeRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), Revision: base, CountOnly: true})
	p.check(t, "count after", &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte("m"), CountOnly: true})
	if d := p.stateDiff(); d != "" {
		t.Fatal(d)
	}
	got := map[string]string{}
	for name, w := range watches {
		got[name] = largeTranscript(t, name, w, n+(n/4+1)/2)
	}
	if got[p.ref.name] != got[p.cand.name] {
		t.Fatalf("watch differs:\n  etcd:     %s\n  %s: %s", got[p.ref.name], p.cand.name, got[p.cand.name])
	}
	t.Logf("watch: %s", got[p.ref.name])
}

// fillCompat puts n keys under prefix, of about the length of a kube
// object's key, on both servers in Txns of 128 puts, every other key on
// lease if lease != 0.
func fillCompat(t *testing.T, p *pair, prefix string, n int, lease int64) {
	t.Helper()
	name := strings.Repeat("x", 60)
	for i := 0; i < n; i += 128 {
		txn := &pb.TxnRequest{}
		for j := i; j < min(n, i+128); j++ {
			put := &pb.PutRequest{Key: []byte(fmt.Sprintf("%sns/%s-%07d", prefix, name, j)), Value: []byte(fmt.Sprintf("value %d", j))}
			if lease != 0 && j%2 == 0 {
				put.Lease = lease
			}
			txn.Success = append(txn.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: put}})
		}
		if o := p.exec(txn); !o.equal() {
			t.Fatal(p.mismatch("fill", o))
		}
	}
}

// execLarge is exec with a deadline for large requests.
func (p *pair) execLarge(req any) outcome {
	do := func(s *server) (any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), largeTimeout)
		defer cancel()
		switch r := req.(type) {
		case *pb.DeleteRangeRequest:
			return s.kv.DeleteRange(ctx, r)
		case *pb.LeaseRevokeRequest:
			resp, err := s.lease.LeaseRevoke(ctx, r)
			if err != nil {
				return nil, err
			}
			// Rendered as the revision it moved to, like a delete's.
			return &pb.DeleteRangeResponse{Header: resp.Header}, nil
		}
		panic(fmt.Sprintf("execLarge: %T", req))
	}
	refResp, refErr, candResp, candErr := p.onBoth(do)
	return outcome{req: req, refResp: refResp, refErr: refErr, ref: respStr(refResp, refErr), cand: respStr(candResp, candErr)}
}

func reqStrLarge(req any) string {
	if r, ok := req.(*pb.LeaseRevokeRequest); ok {
		return fmt.Sprintf("LeaseRevoke id=%d", r.ID)
	}
	return reqStr(req)
}

// largeTranscript reads a watch until it has n events and summarises it:
// per event-carrying response, its revisions and event count; then every
// event, in order, so that any difference shows.
func largeTranscript(t *testing.T, name string, w *watchStream, n int) string {
	t.Helper()
	var shape []string
	var events strings.Builder
	got := 0
	deadline := time.After(largeTimeout)
	for got < n {
		select {
		case r := <-w.ch:
			if len(r.Events) == 0 {
				continue // the created response
			}
			first, last := r.Events[0].Kv.ModRevision, r.Events[len(r.Events)-1].Kv.ModRevision
			shape = append(shape, fmt.Sprintf("%d events at %d..%d fragment=%v", len(r.Events), first, last, r.Fragment))
			for _, ev := range r.Events {
				events.WriteString(eventStr(ev))
				events.WriteByte('\n')
			}
			got += len(r.Events)
		case err := <-w.errc:
			t.Fatalf("%s: watch ended after %d events: %v", name, got, err)
		case <-deadline:
			t.Fatalf("%s: %d of %d events", name, got, n)
		}
	}
	h := fnv.New64a()
	h.Write([]byte(events.String()))
	return fmt.Sprintf("responses %v; %d events, %d bytes rendered, hash %x", shape, got, events.Len(), h.Sum64())
}
