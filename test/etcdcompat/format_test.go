package etcdcompat

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/status"
)

// This file renders requests and responses as canonical, readable strings.
// Two servers agree on an operation when the renderings of their answers are
// byte-identical. Headers are reduced to their revision (cluster_id,
// member_id and raft_term legitimately differ); a missing header renders as
// "hdr=nil".

// bytesStr renders a key or value; long values are shown by length and digest
// so that the rendering stays short but still distinguishes contents.
func bytesStr(b []byte) string {
	if len(b) > 64 {
		sum := sha256.Sum256(b)
		return fmt.Sprintf("<%d bytes %q... sha256:%x>", len(b), b[:16], sum[:8])
	}
	return fmt.Sprintf("%q", b)
}

// rangeEndStr renders a range_end together with its meaning.
func rangeEndStr(end []byte) string {
	switch {
	case len(end) == 0:
		return ""
	case len(end) == 1 && end[0] == 0:
		return `..(from-key "\x00")`
	default:
		return ".." + bytesStr(end)
	}
}

func errStr(err error) string {
	st := status.Convert(err)
	return fmt.Sprintf("ERROR{code=%s msg=%q}", st.Code(), st.Message())
}

func hdrStr(h *pb.ResponseHeader) string {
	if h == nil {
		return "hdr=nil"
	}
	return fmt.Sprintf("rev=%d", h.Revision)
}

func kvStr(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "nil"
	}
	return fmt.Sprintf("{key=%s value=%s create=%d mod=%d ver=%d lease=%d}",
		bytesStr(kv.Key), bytesStr(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
}

func kvsStr(kvs []*mvccpb.KeyValue) string {
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = kvStr(kv)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// respStr renders any unary response (or the error) canonically.
func respStr(resp any, err error) string {
	if err != nil {
		return errStr(err)
	}
	switch r := resp.(type) {
	case *pb.RangeResponse:
		if r == nil {
			return "Range<nil>"
		}
		return fmt.Sprintf("Range{%s count=%d more=%t kvs=%s}", hdrStr(r.Header), r.Count, r.More, kvsStr(r.Kvs))
	case *pb.PutResponse:
		if r == nil {
			return "Put<nil>"
		}
		s := fmt.Sprintf("Put{%s", hdrStr(r.Header))
		if r.PrevKv != nil {
			s += " prev_kv=" + kvStr(r.PrevKv)
		}
		return s + "}"
	case *pb.DeleteRangeResponse:
		if r == nil {
			return "Delete<nil>"
		}
		s := fmt.Sprintf("Delete{%s deleted=%d", hdrStr(r.Header), r.Deleted)
		if len(r.PrevKvs) != 0 {
			s += " prev_kvs=" + kvsStr(r.PrevKvs)
		}
		return s + "}"
	case *pb.TxnResponse:
		if r == nil {
			return "Txn<nil>"
		}
		parts := make([]string, len(r.Responses))
		for i, op := range r.Responses {
			parts[i] = respOpStr(op)
		}
		return fmt.Sprintf("Txn{%s succeeded=%t responses=[%s]}", hdrStr(r.Header), r.Succeeded, strings.Join(parts, ", "))
	case *pb.CompactionResponse:
		if r == nil {
			return "Compact<nil>"
		}
		return fmt.Sprintf("Compact{%s}", hdrStr(r.Header))
	case *pb.LeaseGrantResponse:
		return fmt.Sprintf("LeaseGrant{%s id=%d ttl=%d error=%q}", hdrStr(r.Header), r.ID, r.TTL, r.Error)
	case *pb.LeaseRevokeResponse:
		return fmt.Sprintf("LeaseRevoke{%s}", hdrStr(r.Header))
	case *pb.LeaseTimeToLiveResponse:
		keys := make([]string, len(r.Keys))
		for i, k := range r.Keys {
			keys[i] = bytesStr(k)
		}
		sort.Strings(keys) // etcd returns them in map order
		return fmt.Sprintf("LeaseTimeToLive{%s id=%d ttl=%d granted_ttl=%d keys=[%s]}", hdrStr(r.Header), r.ID, r.TTL, r.GrantedTTL, strings.Join(keys, " "))
	case *pb.LeaseLeasesResponse:
		ids := make([]int64, len(r.Leases))
		for i, l := range r.Leases {
			ids[i] = l.ID
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		return fmt.Sprintf("LeaseLeases{%s ids=%v}", hdrStr(r.Header), ids)
	case *pb.LeaseKeepAliveResponse:
		return fmt.Sprintf("LeaseKeepAlive{%s id=%d ttl=%d}", hdrStr(r.Header), r.ID, r.TTL)
	case nil:
		return "<nil>"
	default:
		return fmt.Sprintf("%T%v", resp, resp)
	}
}

func respOpStr(op *pb.ResponseOp) string {
	if op == nil {
		return "nil"
	}
	switch r := op.Response.(type) {
	case *pb.ResponseOp_ResponseRange:
		return respStr(r.ResponseRange, nil)
	case *pb.ResponseOp_ResponsePut:
		return respStr(r.ResponsePut, nil)
	case *pb.ResponseOp_ResponseDeleteRange:
		return respStr(r.ResponseDeleteRange, nil)
	case *pb.ResponseOp_ResponseTxn:
		return respStr(r.ResponseTxn, nil)
	case nil:
		return "empty"
	default:
		return fmt.Sprintf("%T", r)
	}
}

// reqStr renders a request for diagnostics.
func reqStr(req any) string {
	switch r := req.(type) {
	case *pb.RangeRequest:
		s := "Range " + bytesStr(r.Key) + rangeEndStr(r.RangeEnd)
		if r.Revision != 0 {
			s += fmt.Sprintf(" rev=%d", r.Revision)
		}
		if r.Limit != 0 {
			s += fmt.Sprintf(" limit=%d", r.Limit)
		}
		if r.SortOrder != 0 || r.SortTarget != 0 {
			s += fmt.Sprintf(" sort=%s/%s", sortOrderStr(r.SortOrder), sortTargetStr(r.SortTarget))
		}
		if r.KeysOnly {
			s += " keys_only"
		}
		if r.CountOnly {
			s += " count_only"
		}
		if r.Serializable {
			s += " serializable"
		}
		if r.MinModRevision != 0 {
			s += fmt.Sprintf(" min_mod=%d", r.MinModRevision)
		}
		if r.MaxModRevision != 0 {
			s += fmt.Sprintf(" max_mod=%d", r.MaxModRevision)
		}
		if r.MinCreateRevision != 0 {
			s += fmt.Sprintf(" min_create=%d", r.MinCreateRevision)
		}
		if r.MaxCreateRevision != 0 {
			s += fmt.Sprintf(" max_create=%d", r.MaxCreateRevision)
		}
		return s
	case *pb.PutRequest:
		s := "Put " + bytesStr(r.Key) + "=" + bytesStr(r.Value)
		if r.Lease != 0 {
			s += fmt.Sprintf(" lease=%d", r.Lease)
		}
		if r.PrevKv {
			s += " prev_kv"
		}
		if r.IgnoreValue {
			s += " ignore_value"
		}
		if r.IgnoreLease {
			s += " ignore_lease"
		}
		return s
	case *pb.DeleteRangeRequest:
		s := "Delete " + bytesStr(r.Key) + rangeEndStr(r.RangeEnd)
		if r.PrevKv {
			s += " prev_kv"
		}
		return s
	case *pb.TxnRequest:
		cmps := make([]string, len(r.Compare))
		for i, c := range r.Compare {
			cmps[i] = cmpStr(c)
		}
		return fmt.Sprintf("Txn{if [%s] then [%s] else [%s]}", strings.Join(cmps, " && "), reqOpsStr(r.Success), reqOpsStr(r.Failure))
	case *pb.CompactionRequest:
		s := fmt.Sprintf("Compact rev=%d", r.Revision)
		if r.Physical {
			s += " physical"
		}
		return s
	default:
		return fmt.Sprintf("%T%v", req, req)
	}
}

func reqOpsStr(ops []*pb.RequestOp) string {
	parts := make([]string, len(ops))
	for i, op := range ops {
		switch r := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			parts[i] = reqStr(r.RequestRange)
		case *pb.RequestOp_RequestPut:
			parts[i] = reqStr(r.RequestPut)
		case *pb.RequestOp_RequestDeleteRange:
			parts[i] = reqStr(r.RequestDeleteRange)
		case *pb.RequestOp_RequestTxn:
			parts[i] = reqStr(r.RequestTxn)
		default:
			parts[i] = "<empty op>"
		}
	}
	return strings.Join(parts, "; ")
}

func cmpStr(c *pb.Compare) string {
	var v string
	switch u := c.TargetUnion.(type) {
	case *pb.Compare_Value:
		v = "value:" + bytesStr(u.Value)
	case *pb.Compare_Version:
		v = fmt.Sprintf("version:%d", u.Version)
	case *pb.Compare_CreateRevision:
		v = fmt.Sprintf("create:%d", u.CreateRevision)
	case *pb.Compare_ModRevision:
		v = fmt.Sprintf("mod:%d", u.ModRevision)
	case *pb.Compare_Lease:
		v = fmt.Sprintf("lease:%d", u.Lease)
	case nil:
		v = "<unset>"
	}
	target, ok := pb.Compare_CompareTarget_name[int32(c.Target)]
	if !ok {
		target = fmt.Sprintf("TARGET(%d)", c.Target)
	}
	result, ok := pb.Compare_CompareResult_name[int32(c.Result)]
	if !ok {
		result = fmt.Sprintf("RESULT(%d)", c.Result)
	}
	return fmt.Sprintf("%s(%s%s) %s %s", target, bytesStr(c.Key), rangeEndStr(c.RangeEnd), result, v)
}

func sortOrderStr(o pb.RangeRequest_SortOrder) string {
	if n, ok := pb.RangeRequest_SortOrder_name[int32(o)]; ok {
		return n
	}
	return fmt.Sprintf("ORDER(%d)", o)
}

func sortTargetStr(o pb.RangeRequest_SortTarget) string {
	if n, ok := pb.RangeRequest_SortTarget_name[int32(o)]; ok {
		return n
	}
	return fmt.Sprintf("TARGET(%d)", o)
}
