package etcdcompat

import (
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// do sends one KV request (Range, Put, DeleteRange, Txn or Compaction).
func (s *server) do(req any) (any, error) {
	ctx, cancel := ctxOp()
	defer cancel()
	switch r := req.(type) {
	case *pb.RangeRequest:
		return s.kv.Range(ctx, r)
	case *pb.PutRequest:
		return s.kv.Put(ctx, r)
	case *pb.DeleteRangeRequest:
		return s.kv.DeleteRange(ctx, r)
	case *pb.TxnRequest:
		return s.kv.Txn(ctx, r)
	case *pb.CompactionRequest:
		return s.kv.Compact(ctx, r)
	default:
		panic(fmt.Sprintf("do: unsupported request %T", req))
	}
}

// outcome is what both servers answered to one request.
type outcome struct {
	req       any
	refResp   any
	refErr    error
	ref, cand string // canonical renderings
}

func (o outcome) equal() bool { return o.ref == o.cand }

// onBoth runs do on the reference and the candidate at the same time. The
// two servers are independent, so each still sees a test's requests in the
// test's order; a step waits for the slower answer, not for both in turn.
func (p *pair) onBoth(do func(*server) (any, error)) (refResp any, refErr error, candResp any, candErr error) {
	refDone := make(chan struct{})
	go func() {
		defer close(refDone)
		refResp, refErr = do(p.ref)
	}()
	candResp, candErr = do(p.cand)
	<-refDone
	return refResp, refErr, candResp, candErr
}

// exec sends req to both servers and renders the answers.
func (p *pair) exec(req any) outcome {
	refResp, refErr, candResp, candErr := p.onBoth(func(s *server) (any, error) { return s.do(req) })
	return outcome{req: req, refResp: refResp, refErr: refErr, ref: respStr(refResp, refErr), cand: respStr(candResp, candErr)}
}

// mismatch formats a diagnostic for a differing outcome.
func (p *pair) mismatch(ctx string, o outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "MISMATCH %s\n  op:       %s\n  etcd:     %s\n  %-9s %s", ctx, reqStr(o.req), o.ref, p.cand.name+":", o.cand)
	if hint := diffHint(o.ref, o.cand); hint != "" {
		fmt.Fprintf(&b, "\n  note:     %s", hint)
	}
	return b.String()
}

// diffHint points at the first differing character of two renderings.
func diffHint(a, b string) string {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	lo := max(0, i-40)
	ea, eb := min(len(a), i+60), min(len(b), i+60)
	return fmt.Sprintf("first difference at byte %d: etcd …%s… vs …%s…", i, a[lo:ea], b[lo:eb])
}

// check runs req on both and reports a mismatch as a test error. It returns
// the outcome so that callers can inspect the reference answer.
func (p *pair) check(t *testing.T, ctx string, req any) outcome {
	t.Helper()
	o := p.exec(req)
	if !o.equal() {
		t.Error(p.mismatch(ctx, o))
	}
	return o
}

// allRange reads every key at revision rev (0: current).
func allRange(rev int64) *pb.RangeRequest {
	return &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev}
}

// stateEqual compares the full keyspace and header revision of both servers.
// It returns "" when they agree, otherwise a diagnostic.
func (p *pair) stateDiff() string {
	o := p.exec(allRange(0))
	if o.equal() {
		return ""
	}
	return fmt.Sprintf("full state differs:\n  etcd:     %s\n  %-9s %s\n  note:     %s", o.ref, p.cand.name+":", o.cand, diffHint(o.ref, o.cand))
}

// refRev returns the reference's current revision.
func (p *pair) refRev(t *testing.T) int64 {
	t.Helper()
	resp, err := p.ref.do(allRange(0))
	if err != nil {
		t.Fatalf("reference Range failed: %v", err)
	}
	return resp.(*pb.RangeResponse).Header.Revision
}

// headerRev extracts the header revision of a unary KV response, or -1.
func headerRev(resp any) int64 {
	type hdr interface{ GetHeader() *pb.ResponseHeader }
	if h, ok := resp.(hdr); ok && h.GetHeader() != nil {
		return h.GetHeader().Revision
	}
	return -1
}
