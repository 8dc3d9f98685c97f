package etcdcompat

import (
	"bytes"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Bad and borderline input. Every case is sent to both servers; the answers
// (usually an error: gRPC code and message) must be identical, and afterwards
// the full keyspace and the header revision must be identical too. Cases
// marked wantErr must leave the reference's revision unchanged as well (they
// are meant to "change nothing").

type badCase struct {
	name      string
	req       any
	wantErr   bool // etcd answers with an error (checked on the reference)
	mayChange bool // a valid request that may legitimately change the state
}

// Request-building shorthands.
func put(k, v string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}}
}

func opPut(r *pb.PutRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: r}}
}

func get(k, end string) *pb.RequestOp {
	return opRange(&pb.RangeRequest{Key: []byte(k), RangeEnd: bytesOrNil(end)})
}

func opRange(r *pb.RangeRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
}

func del(k, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k), RangeEnd: bytesOrNil(end)}}}
}

func nested(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Compare: cmps, Success: then, Failure: els}}}
}

func txn(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.TxnRequest {
	return &pb.TxnRequest{Compare: cmps, Success: then, Failure: els}
}

func ops(o ...*pb.RequestOp) []*pb.RequestOp { return o }

func cmpVersion(k, end string, res pb.Compare_CompareResult, v int64) *pb.Compare {
	return &pb.Compare{Key: []byte(k), RangeEnd: bytesOrNil(end), Target: pb.Compare_VERSION, Result: res, TargetUnion: &pb.Compare_Version{Version: v}}
}

func bytesOrNil(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// cmpTrue always succeeds (version of a missing key is 0).
var cmpTrue = []*pb.Compare{cmpVersion("no-such-key", "", pb.Compare_EQUAL, 0)}

// cmpFalse always fails.
var cmpFalse = []*pb.Compare{cmpVersion("no-such-key", "", pb.Compare_GREATER, 0)}

func repeatOps(n int, f func(i int) *pb.RequestOp) []*pb.RequestOp {
	r := make([]*pb.RequestOp, n)
	for i := range r {
		r[i] = f(i)
	}
	return r
}

const maxRequestBytes = 3 * 1024 * 1024 / 2 // etcd's default 1.5 MiB

// seedState writes a small fixed keyspace on both servers.
func seedState(t *testing.T, p *pair) {
	t.Helper()
	for _, kv := range [][2]string{{"a", "1"}, {"a/b", "2"}, {"b", "3"}, {"c", "4"}, {"\x00", "z"}, {"\xff", "y"}, {"d", "5"}} {
		p.check(t, "seeding", &pb.PutRequest{Key: []byte(kv[0]), Value: []byte(kv[1])})
	}
	p.check(t, "seeding", &pb.DeleteRangeRequest{Key: []byte("c")})
	if d := p.stateDiff(); d != "" {
		t.Fatalf("after seeding: %s", d)
	}
}

// runBadCases runs cases in order on p, checking answers and state.
func runBadCases(t *testing.T, p *pair, cases []badCase) {
	t.Helper()
	for _, c := range cases {
		before := p.refRev(t)
		o := p.exec(c.req)
		t.Logf("%s: etcd answered %s", c.name, o.ref)
		if !o.equal() {
			t.Error(p.mismatch("("+c.name+")", o))
		}
		if (o.refErr != nil) != c.wantErr {
			t.Errorf("harness expectation for %q is stale: etcd answered %s (wantErr=%t)", c.name, o.ref, c.wantErr)
		}
		if d := p.stateDiff(); d != "" {
			t.Fatalf("after %q (%s): %s", c.name, reqStr(c.req), d)
		}
		if !c.mayChange {
			if after := p.refRev(t); after != before {
				t.Errorf("harness expectation for %q is stale: etcd's revision moved %d -> %d", c.name, before, after)
			}
		}
	}
}

func TestKVBadInputCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	seedState(t, p)

	big := func(n int) []byte { return bytes.Repeat([]byte{'x'}, n) }
	tooMany := func(n int) []*pb.RequestOp {
		return repeatOps(n, func(i int) *pb.RequestOp { return put(fmt.Sprintf("many/%03d", i), "v") })
	}
	manyCmps := func(n int) []*pb.Compare {
		r := make([]*pb.Compare, n)
		for i := range r {
			r[i] = cmpVersion(fmt.Sprintf("k%03d", i), "", pb.Compare_EQUAL, 0)
		}
		return r
	}
	manyGets := func(n int) []*pb.RequestOp {
		return repeatOps(n, func(i int) *pb.RequestOp { return get(fmt.Sprintf("g%03d", i), "") })
	}

	t.Run("empty-key", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "put empty key", req: &pb.PutRequest{Value: []byte("v")}, wantErr: true},
			{name: "put empty key prev_kv", req: &pb.PutRequest{Key: []byte{}, Value: []byte("v"), PrevKv: true}, wantErr: true},
			{name: "range empty key", req: &pb.RangeRequest{}, wantErr: true},
			{name: "range empty key from-key", req: &pb.RangeRequest{RangeEnd: []byte{0}}, wantErr: true},
			{name: "range empty key with end", req: &pb.RangeRequest{RangeEnd: []byte("b")}, wantErr: true},
			{name: "delete empty key", req: &pb.DeleteRangeRequest{}, wantErr: true},
			{name: "delete empty key from-key", req: &pb.DeleteRangeRequest{RangeEnd: []byte{0}}, wantErr: true},
			{name: "txn compare empty key", req: txn([]*pb.Compare{cmpVersion("", "", pb.Compare_EQUAL, 0)}, ops(put("x", "1")), nil), wantErr: true},
			{name: "txn compare empty key with range_end", req: txn([]*pb.Compare{cmpVersion("", "\x00", pb.Compare_GREATER, 0)}, nil, nil), wantErr: true},
			{name: "txn put empty key", req: txn(nil, ops(put("x", "1"), put("", "1")), nil), wantErr: true},
			{name: "txn range empty key", req: txn(nil, ops(get("", "")), nil), wantErr: true},
			{name: "txn delete empty key", req: txn(nil, ops(del("", "\x00")), nil), wantErr: true},
			{name: "txn empty key in untaken failure branch", req: txn(cmpTrue, ops(put("x", "1")), ops(put("", "1"))), wantErr: true},
			{name: "nested txn compare empty key", req: txn(nil, ops(nested([]*pb.Compare{cmpVersion("", "", pb.Compare_EQUAL, 0)}, nil, nil)), nil), wantErr: true},
			{name: "nested txn put empty key in failure", req: txn(nil, ops(put("x", "1"), nested(nil, nil, ops(put("", "1")))), nil), wantErr: true},
		})
	})

	t.Run("inverted-range", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "range end < key", req: &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte("a")}},
			{name: "range end == key", req: &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte("b")}},
			{name: "range end < key count_only", req: &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte("a"), CountOnly: true}},
			{name: "delete end < key", req: &pb.DeleteRangeRequest{Key: []byte("b"), RangeEnd: []byte("a"), PrevKv: true}},
			{name: "delete end == key", req: &pb.DeleteRangeRequest{Key: []byte("b"), RangeEnd: []byte("b")}},
			{name: "txn compare over inverted range", req: txn([]*pb.Compare{cmpVersion("b", "a", pb.Compare_EQUAL, 0)}, ops(get("a", "\x00")), ops(get("b", "")))},
			{name: "txn delete inverted range", req: txn(nil, ops(del("b", "a")), nil)},
			{name: "txn delete inverted range + put inside", req: txn(nil, ops(del("z", "a"), put("b", "new")), nil), mayChange: true},
		})
	})

	t.Run("too-large", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "put value of exactly 1.5 MiB", req: &pb.PutRequest{Key: []byte("big"), Value: big(maxRequestBytes)}, wantErr: true},
			{name: "put value of 1.5 MiB + 1", req: &pb.PutRequest{Key: []byte("big"), Value: big(maxRequestBytes + 1)}, wantErr: true},
			{name: "put key of 1.5 MiB", req: &pb.PutRequest{Key: big(maxRequestBytes), Value: []byte("v")}, wantErr: true},
			{name: "put value of 2 MiB + 1 KiB (over the gRPC limit)", req: &pb.PutRequest{Key: []byte("big"), Value: big(2*1024*1024 + 1024)}, wantErr: true},
			{name: "put value of 3 MiB", req: &pb.PutRequest{Key: []byte("big"), Value: big(3 * 1024 * 1024)}, wantErr: true},
			{name: "txn of 3 puts of 600 KiB", req: txn(nil, ops(
				opPut(&pb.PutRequest{Key: []byte("big1"), Value: big(600 * 1024)}),
				opPut(&pb.PutRequest{Key: []byte("big2"), Value: big(600 * 1024)}),
				opPut(&pb.PutRequest{Key: []byte("big3"), Value: big(600 * 1024)})), nil), wantErr: true},
			{name: "txn with a 1.6 MiB compare value and a put", req: txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: big(1600 * 1024)}}}, ops(put("x", "1")), nil), wantErr: true},
			// Reads are not replicated requests: etcd serves them below the gRPC limit.
			{name: "range with a 1.6 MiB key", req: &pb.RangeRequest{Key: big(1600 * 1024)}},
			{name: "read-only txn with a 1.6 MiB compare value", req: txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: big(1600 * 1024)}}}, ops(get("a", "")), nil)},
			{name: "range with a 2 MiB + 1 KiB key (over the gRPC limit)", req: &pb.RangeRequest{Key: big(2*1024*1024 + 1024)}, wantErr: true},
			{name: "put value of 1.5 MiB - 1 KiB (accepted)", req: &pb.PutRequest{Key: []byte("big"), Value: big(maxRequestBytes - 1024)}, mayChange: true},
			{name: "read back the big value", req: &pb.RangeRequest{Key: []byte("big")}},
			{name: "delete the big value", req: &pb.DeleteRangeRequest{Key: []byte("big"), PrevKv: true}, mayChange: true},
		})
	})

	t.Run("duplicate-key", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "put/put", req: txn(nil, ops(put("a", "1"), put("a", "2")), nil), wantErr: true},
			{name: "put/put in failure", req: txn(cmpTrue, nil, ops(put("a", "1"), put("a", "2"))), wantErr: true},
			{name: "put/delete", req: txn(nil, ops(put("a", "1"), del("a", "")), nil), wantErr: true},
			{name: "delete/put", req: txn(nil, ops(del("a", ""), put("a", "1")), nil), wantErr: true},
			{name: "delete range covering put", req: txn(nil, ops(del("a", "c"), put("b", "1")), nil), wantErr: true},
			{name: "delete prefix covering put", req: txn(nil, ops(put("a/b/c", "1"), del("a/", "a0")), nil), wantErr: true},
			{name: "put in then of nested txn + outer put", req: txn(nil, ops(nested(nil, ops(put("a", "1")), nil), put("a", "2")), nil), wantErr: true},
			{name: "outer put + put in else of nested txn", req: txn(nil, ops(put("a", "2"), nested(nil, nil, ops(put("a", "1")))), nil), wantErr: true},
			{name: "puts in two sibling nested txns", req: txn(nil, ops(nested(nil, ops(put("a", "1")), nil), nested(nil, ops(put("a", "2")), nil)), nil), wantErr: true},
			{name: "outer delete + nested put", req: txn(nil, ops(del("a", ""), nested(nil, ops(put("a", "1")), nil)), nil), wantErr: true},
			{name: "nested delete + outer put", req: txn(nil, ops(nested(nil, ops(del("a", "b")), nil), put("a/b", "1")), nil), wantErr: true},
			{name: "nested delete then sibling nested put", req: txn(nil, ops(nested(nil, ops(del("a", "")), nil), nested(nil, ops(put("a", "1")), nil)), nil), wantErr: true},
			{name: "doubly nested put + outer put", req: txn(nil, ops(nested(nil, ops(nested(nil, ops(put("b", "1")), nil)), nil), put("b", "2")), nil), wantErr: true},
			{name: "nested put in then and else of the same txn + outer put", req: txn(nil, ops(nested(cmpTrue, ops(put("b", "1")), ops(put("b", "2"))), put("b", "3")), nil), wantErr: true},
			// etcd's rules allow these:
			// (a from-key delete is checked as the inverted interval ["b", "\x00"), which contains nothing)
			{name: "allowed: delete from-key covering put", req: txn(nil, ops(put("zz", "1"), del("b", "\x00")), nil), mayChange: true},
			{name: "allowed: nested put then sibling nested delete", req: txn(nil, ops(nested(nil, ops(put("a", "n1")), nil), nested(nil, ops(del("a", "")), nil)), nil), mayChange: true},
			{name: "allowed: same key in nested then and else", req: txn(nil, ops(nested(cmpFalse, ops(put("b", "t")), ops(put("b", "e")))), nil), mayChange: true},
			{name: "allowed: same key in success and failure", req: txn(cmpTrue, ops(put("b", "s")), ops(put("b", "f"))), mayChange: true},
			{name: "allowed: two overlapping deletes", req: txn(nil, ops(del("a", "b"), del("a/", "a0")), nil), mayChange: true},
			{name: "allowed: range and put of one key", req: txn(nil, ops(get("b", ""), put("b", "r"), get("b", "")), nil), mayChange: true},
			{name: "allowed: put and nested range", req: txn(nil, ops(put("d", "p"), nested(nil, ops(get("d", "")), nil)), nil), mayChange: true},
		})
	})

	t.Run("too-many-ops", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "129 puts in success", req: txn(nil, tooMany(129), nil), wantErr: true},
			{name: "129 puts in failure", req: txn(cmpTrue, nil, tooMany(129)), wantErr: true},
			{name: "129 compares", req: txn(manyCmps(129), nil, nil), wantErr: true},
			{name: "129 ranges (read-only)", req: txn(nil, manyGets(129), nil), wantErr: true},
			// a nested txn may have at most 128 - max(#compares, #success, #failure) ops of the enclosing txn
			{name: "63 ranges + nested txn of 65 ranges", req: txn(nil, append(manyGets(63), nested(nil, manyGets(65), nil)), nil), wantErr: true},
			{name: "64 ranges + nested txn of 64 ranges", req: txn(nil, append(manyGets(64), nested(nil, manyGets(64), nil)), nil), wantErr: true},
			{name: "100 compares + nested txn of 29 ranges", req: txn(manyCmps(100), ops(nested(nil, manyGets(29), nil)), nil), wantErr: true},
			{name: "128 compares", req: txn(manyCmps(128), nil, nil)},
			{name: "63 ranges + nested txn of 64 ranges", req: txn(nil, append(manyGets(63), nested(nil, manyGets(64), nil)), nil)},
			{name: "126 ranges + nested txn of 1 range", req: txn(nil, append(manyGets(126), nested(nil, manyGets(1), nil)), nil)},
			{name: "126 ranges + nested txn of 2 ranges", req: txn(nil, append(manyGets(126), nested(nil, manyGets(2), nil)), nil), wantErr: true},
			{name: "127 ranges + nested txn of 1 range", req: txn(nil, append(manyGets(127), nested(nil, manyGets(1), nil)), nil), wantErr: true},
			{name: "127 ranges + empty nested txn", req: txn(nil, append(manyGets(127), nested(nil, nil, nil)), nil)},
			{name: "128 puts", req: txn(nil, tooMany(128), nil), mayChange: true},
		})
	})

	t.Run("invalid-enums", func(t *testing.T) {
		rr := func(o, tg int32) *pb.RangeRequest {
			return &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte{0}, SortOrder: pb.RangeRequest_SortOrder(o), SortTarget: pb.RangeRequest_SortTarget(tg)}
		}
		runBadCases(t, p, []badCase{
			{name: "sort order 3", req: rr(3, 0), wantErr: true},
			{name: "sort order -1", req: rr(-1, 1), wantErr: true},
			{name: "sort target 5", req: rr(1, 5), wantErr: true},
			{name: "sort target 100 with order none", req: rr(0, 100), wantErr: true},
			{name: "invalid sort in txn range", req: txn(nil, ops(put("x", "1"), opRange(rr(2, 9))), nil), wantErr: true},
			{name: "invalid sort in nested txn range", req: txn(nil, ops(nested(nil, nil, ops(opRange(rr(7, 0))))), nil), wantErr: true},
			{name: "txn op with no request set", req: txn(nil, ops(put("x", "1"), &pb.RequestOp{}), nil), wantErr: true},
			{name: "compare target 9 (not an enum value)", req: txn([]*pb.Compare{{Key: []byte("a"), Target: 9, Result: pb.Compare_EQUAL}}, ops(get("a", "")), ops(get("b", "")))},
			{name: "compare result 7 (not an enum value)", req: txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VERSION, Result: 7, TargetUnion: &pb.Compare_Version{Version: 99}}}, ops(get("a", "")), ops(get("b", "")))},
			{name: "compare VERSION with a mod_revision union", req: txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_ModRevision{ModRevision: 1000}}}, ops(get("a", "")), ops(get("b", "")))},
			{name: "compare VALUE without a union", req: txn([]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, Result: pb.Compare_GREATER}}, ops(get("a", "")), ops(get("b", "")))},
			{name: "compare VALUE on a missing key NOT_EQUAL", req: txn([]*pb.Compare{{Key: []byte("nope"), Target: pb.Compare_VALUE, Result: pb.Compare_NOT_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte("x")}}}, ops(get("a", "")), ops(get("b", "")))},
		})
	})

	t.Run("put-flags-and-leases", func(t *testing.T) {
		runBadCases(t, p, []badCase{
			{name: "put with a lease that does not exist", req: &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), Lease: 123456}, wantErr: true},
			{name: "put with a negative lease that does not exist", req: &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), Lease: -5}, wantErr: true},
			{name: "txn put with a lease that does not exist", req: txn(nil, ops(put("x", "1"), opPut(&pb.PutRequest{Key: []byte("a"), Lease: 123456})), nil), wantErr: true},
			{name: "nested txn put with a lease that does not exist", req: txn(nil, ops(put("x", "1"), nested(cmpTrue, ops(opPut(&pb.PutRequest{Key: []byte("a"), Lease: 123456})), nil)), nil), wantErr: true},
			{name: "unknown lease in the untaken branch", req: txn(cmpTrue, ops(get("a", "")), ops(opPut(&pb.PutRequest{Key: []byte("a"), Lease: 123456}))), mayChange: true},
			{name: "ignore_value on a missing key", req: &pb.PutRequest{Key: []byte("missing"), IgnoreValue: true}, wantErr: true},
			{name: "ignore_lease on a missing key", req: &pb.PutRequest{Key: []byte("missing"), Value: []byte("v"), IgnoreLease: true}, wantErr: true},
			{name: "ignore_value with a value", req: &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), IgnoreValue: true}, wantErr: true},
			{name: "ignore_lease with a lease", req: &pb.PutRequest{Key: []byte("a"), Value: []byte("v"), Lease: 5, IgnoreLease: true}, wantErr: true},
			{name: "ignore_value and ignore_lease on a missing key", req: &pb.PutRequest{Key: []byte("missing"), IgnoreValue: true, IgnoreLease: true, PrevKv: true}, wantErr: true},
			{name: "txn put ignore_value on a missing key", req: txn(nil, ops(put("x", "1"), opPut(&pb.PutRequest{Key: []byte("missing"), IgnoreValue: true})), nil), wantErr: true},
			{name: "txn put ignore_value with a value", req: txn(nil, ops(opPut(&pb.PutRequest{Key: []byte("a"), Value: []byte("v"), IgnoreValue: true})), nil), wantErr: true},
			{name: "ignore_value on an existing key", req: &pb.PutRequest{Key: []byte("d"), IgnoreValue: true, PrevKv: true}, mayChange: true},
			{name: "ignore_lease on an existing key", req: &pb.PutRequest{Key: []byte("d"), Value: []byte("il"), IgnoreLease: true, PrevKv: true}, mayChange: true},
			{name: "ignore_value and ignore_lease on an existing key", req: &pb.PutRequest{Key: []byte("d"), IgnoreValue: true, IgnoreLease: true, PrevKv: true}, mayChange: true},
		})
	})

	t.Run("revisions-and-compaction", func(t *testing.T) {
		cur := p.refRev(t)
		runBadCases(t, p, []badCase{
			{name: "range at a future revision", req: &pb.RangeRequest{Key: []byte("a"), Revision: cur + 1}, wantErr: true},
			{name: "range at a far future revision", req: &pb.RangeRequest{Key: []byte("a"), Revision: 1 << 40}, wantErr: true},
			{name: "range at revision -1", req: &pb.RangeRequest{Key: []byte("a"), Revision: -1}},
			{name: "range limit -1", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte{0}, Limit: -1}},
			{name: "txn range at a future revision", req: txn(nil, ops(get("a", ""), opRange(&pb.RangeRequest{Key: []byte("a"), Revision: cur + 5})), nil), wantErr: true},
			{name: "txn with put and range at a future revision", req: txn(nil, ops(put("x", "1"), opRange(&pb.RangeRequest{Key: []byte("a"), Revision: cur + 1})), nil), wantErr: true},
			{name: "txn range at revision -1 before any compaction", req: txn(nil, ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: -1})), nil)},
			// inside a txn etcd checks "revision < first revision" (-1 before any compaction)
			{name: "txn range at revision -3 before any compaction", req: txn(nil, ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: -3})), nil), wantErr: true},
			{name: "compact at a future revision", req: &pb.CompactionRequest{Revision: cur + 1}, wantErr: true},
			{name: "compact at a far future revision", req: &pb.CompactionRequest{Revision: 1 << 40, Physical: true}, wantErr: true},
			{name: "compact at revision -1", req: &pb.CompactionRequest{Revision: -1}, wantErr: true},
			{name: "compact at revision 0", req: &pb.CompactionRequest{Revision: 0}, mayChange: true},
			{name: "compact at revision 0 again", req: &pb.CompactionRequest{Revision: 0}, wantErr: true},
			{name: "compact at revision 3", req: &pb.CompactionRequest{Revision: 3, Physical: true}, mayChange: true},
			{name: "compact at revision 3 again", req: &pb.CompactionRequest{Revision: 3}, wantErr: true},
			{name: "compact at revision 2", req: &pb.CompactionRequest{Revision: 2, Physical: true}, wantErr: true},
			{name: "range at the compacted revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: 3}},
			{name: "range below the compacted revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: 2}, wantErr: true},
			{name: "range at revision -1 after compaction", req: &pb.RangeRequest{Key: []byte("a"), Revision: -1}},
			{name: "txn range below the compacted revision", req: txn(nil, ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: 2})), nil), wantErr: true},
			{name: "txn range at revision -1 after compaction", req: txn(nil, ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: -1})), nil), wantErr: true},
			{name: "txn compare and put, range below the compacted revision in the untaken branch", req: txn(cmpTrue, ops(put("x", "2")), ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: 2}))), mayChange: true},
			{name: "compact at the current revision", req: &pb.CompactionRequest{Revision: cur}, mayChange: true},
			{name: "range at the old current revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: cur}},
			{name: "range just below it", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: cur - 1}, wantErr: true},
			{name: "delete everything", req: &pb.DeleteRangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, PrevKv: true}, mayChange: true},
			{name: "delete everything again", req: &pb.DeleteRangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, PrevKv: true}},
		})
	})
}

// TestKVSizeBoundaryCompat probes values just below etcd's request size limit.
// etcd rejects a write when its internal raft request encoding exceeds
// MaxRequestBytes; for a Put of key "k" that encoding is the value plus about
// 25 bytes (the request ID is a 9- or 10-byte varint that depends on the
// member ID, so a slack of 23..25 bytes is left out as ambiguous).
func TestKVSizeBoundaryCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	var cases []badCase
	for _, slack := range []int{0, 1, 8, 16, 20, 22, 26, 28, 32, 64, 256} {
		cases = append(cases, badCase{
			name:      fmt.Sprintf("put value of 1.5 MiB - %d bytes", slack),
			req:       &pb.PutRequest{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, maxRequestBytes-slack)},
			wantErr:   slack <= 22,
			mayChange: true,
		})
	}
	// the same through a txn (a txn adds a few bytes of framing)
	for _, slack := range []int{0, 16, 64, 256} {
		cases = append(cases, badCase{
			name:      fmt.Sprintf("txn put value of 1.5 MiB - %d bytes", slack),
			req:       txn(nil, ops(opPut(&pb.PutRequest{Key: []byte("k"), Value: bytes.Repeat([]byte{'t'}, maxRequestBytes-slack)})), nil),
			wantErr:   slack <= 16,
			mayChange: true,
		})
	}
	runBadCases(t, p, cases)
}

// TestKVCompactionEdgesCompat starts from a fresh store: the first compaction
// of a store is special (etcd starts with compaction revision -1).
func TestKVCompactionEdgesCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	p.check(t, "setup", &pb.PutRequest{Key: []byte("a"), Value: []byte("1")})
	p.check(t, "setup", &pb.PutRequest{Key: []byte("a"), Value: []byte("2")})
	runBadCases(t, p, []badCase{
		{name: "txn range at revision -1 on a never compacted store", req: txn(nil, ops(opRange(&pb.RangeRequest{Key: []byte("a"), Revision: -1})), nil)},
		{name: "first compaction at revision 1, physical", req: &pb.CompactionRequest{Revision: 1, Physical: true}, mayChange: true},
		{name: "compaction at revision 1 again", req: &pb.CompactionRequest{Revision: 1, Physical: true}, wantErr: true},
		{name: "range at revision 1", req: &pb.RangeRequest{Key: []byte("a"), Revision: 1}},
		{name: "compaction at the current revision, physical", req: &pb.CompactionRequest{Revision: 3, Physical: true}, mayChange: true},
		{name: "range at revision 2 (compacted)", req: &pb.RangeRequest{Key: []byte("a"), Revision: 2}, wantErr: true},
		{name: "range at revision 3", req: &pb.RangeRequest{Key: []byte("a"), Revision: 3}},
		{name: "put after compaction", req: &pb.PutRequest{Key: []byte("a"), Value: []byte("3"), PrevKv: true}, mayChange: true},
		{name: "range history at revision 3 after put", req: &pb.RangeRequest{Key: []byte("a"), Revision: 3}},
	})
}
