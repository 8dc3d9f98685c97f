package mvcc

import (
	"bytes"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// evaluator evaluates one request as of rev, the revision before it. It reads
// but never writes: the changes it decides are applied afterwards (or, on a
// replay, found already applied), so evaluation is deterministic given the
// store's history.
type evaluator struct {
	tx         storage.ReadTx
	rev        int64
	compactRev int64
	ov         overlay
	changes    []change
	// leaseExists answers whether a lease may be attached to a key.
	leaseExists func(id int64) (bool, error)
}

// change is one key's new state, in etcd's change order (its index is the
// sub-revision).
type change struct {
	key   []byte
	prev  *entry // the live version it replaces, nil if none
	meta  meta
	value []byte
}

// domainError reports whether err is a request-level outcome (an etcd error
// returned to the client) rather than a storage failure.
func domainError(err error) bool {
	for _, d := range []error{ErrCompacted, ErrFutureRev, ErrKeyNotFound, ErrLeaseNotFound, ErrRequestTooLarge} {
		if errors.Is(err, d) {
			return true
		}
	}
	return false
}

func (e *evaluator) curRev() int64 {
	if len(e.changes) > 0 {
		return e.rev + 1
	}
	return e.rev
}

func (e *evaluator) resolve(es []*entry) error { return resolveValues(e.tx, es) }

func (e *evaluator) checkRange(r *pb.RangeRequest) error {
	switch {
	case r.Revision == 0:
		return nil
	case r.Revision > e.rev:
		return ErrFutureRev
	case r.Revision < e.compactRev:
		return ErrCompacted
	}
	return nil
}

// rangeOp is a Range evaluated inside a request (a Txn op or a read-only Txn).
func (e *evaluator) rangeOp(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := e.checkRange(r); err != nil {
		return nil, err
	}
	rev, ov := r.Revision, &e.ov
	if rev <= 0 {
		rev = e.rev // etcd reads the current state for any revision <= 0
	} else {
		ov = nil // an explicit revision never sees this request's writes
	}
	es, err := rangeAt(e.tx, r.Key, normEnd(r.RangeEnd), rev, ov)
	if err != nil {
		return nil, err
	}
	count := len(es)
	if keep := keepFor(r); keep >= 0 && len(es) > keep {
		es = es[:keep]
	}
	return buildRange(r, es, count, e.curRev(), e.resolve)
}

func (e *evaluator) get(key []byte) (*entry, error) {
	return getAt(e.tx, key, e.rev, &e.ov)
}

func (e *evaluator) checkKey(key []byte) error {
	if len(keyspace.History(key, 0)) > storage.MaxKeySize || len(keyspace.Attach(0, key)) > storage.MaxKeySize {
		return ErrRequestTooLarge
	}
	return nil
}

func (e *evaluator) checkLease(id int64) error {
	if id == 0 {
		return nil
	}
	ok, err := e.leaseExists(id)
	if err != nil {
		return err
	}
	if !ok {
		return ErrLeaseNotFound
	}
	return nil
}

// put follows etcd's put: the previous version is read when the request
// needs it, ignore_value/ignore_lease require the key to exist.
func (e *evaluator) put(p *pb.PutRequest) (*pb.PutResponse, error) {
	if err := e.checkKey(p.Key); err != nil {
		return nil, err
	}
	prev, err := e.get(p.Key)
	if err != nil {
		return nil, err
	}
	if (p.IgnoreValue || p.IgnoreLease) && prev == nil {
		return nil, ErrKeyNotFound
	}
	resp := &pb.PutResponse{Header: &pb.ResponseHeader{}}
	val, lease := p.Value, p.Lease
	if prev != nil && (p.IgnoreValue || p.PrevKv) {
		if err := e.resolve([]*entry{prev}); err != nil {
			return nil, err
		}
	}
	if p.IgnoreValue {
		val = prev.value
	}
	if p.IgnoreLease {
		lease = prev.meta.Lease
	}
	if p.PrevKv && prev != nil {
		resp.PrevKv = prev.kv(true)
	}
	m := meta{ModRev: e.rev + 1, CreateRev: e.rev + 1, Version: 1, Lease: lease}
	if prev != nil {
		m.CreateRev, m.Version = prev.meta.CreateRev, prev.meta.Version+1
	}
	e.record(change{key: bytes.Clone(p.Key), prev: prev, meta: m, value: val})
	resp.Header.Revision = e.rev + 1
	return resp, nil
}

func (e *evaluator) record(c change) {
	e.changes = append(e.changes, c)
	e.ov.set(&pendingKV{key: c.key, meta: c.meta, value: c.value})
}

func (e *evaluator) deleteRange(d *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	es, err := rangeAt(e.tx, d.Key, normEnd(d.RangeEnd), e.rev, &e.ov)
	if err != nil {
		return nil, err
	}
	resp := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}}
	if d.PrevKv {
		if err := e.resolve(es); err != nil {
			return nil, err
		}
		resp.PrevKvs = make([]*mvccpb.KeyValue, len(es))
		for i, x := range es {
			resp.PrevKvs[i] = x.kv(true)
		}
	}
	for _, x := range es {
		e.record(change{key: x.key, prev: x, meta: meta{ModRev: e.rev + 1, Tombstone: true}})
	}
	resp.Deleted = int64(len(es))
	resp.Header.Revision = e.curRev()
	return resp, nil
}

// txn evaluates a Txn as etcd does: every compare of the chosen path first,
// then the checks of the chosen ops against the state before the txn, then
// the ops in order.
func (e *evaluator) txn(rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	path, err := e.compareToPath(rt)
	if err != nil {
		return nil, err
	}
	if _, err := e.checkTxn(rt, path); err != nil {
		return nil, err
	}
	resp, _, err := e.newTxnResp(rt, path)
	if err != nil {
		return nil, err
	}
	if _, err := e.executeTxn(rt, path, resp); err != nil {
		return nil, err
	}
	resp.Header.Revision = e.curRev()
	return resp, nil
}

func (e *evaluator) compareToPath(rt *pb.TxnRequest) ([]bool, error) {
	ok, err := e.applyCompares(rt.Compare)
	if err != nil {
		return nil, err
	}
	path := []bool{ok}
	ops := rt.Success
	if !ok {
		ops = rt.Failure
	}
	for _, op := range ops {
		tv, isTxn := op.Request.(*pb.RequestOp_RequestTxn)
		if !isTxn || tv.RequestTxn == nil {
			continue
		}
		sub, err := e.compareToPath(tv.RequestTxn)
		if err != nil {
			return nil, err
		}
		path = append(path, sub...)
	}
	return path, nil
}

func (e *evaluator) applyCompares(cs []*pb.Compare) (bool, error) {
	for _, c := range cs {
		ok, err := e.applyCompare(c)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func (e *evaluator) applyCompare(c *pb.Compare) (bool, error) {
	es, err := rangeAt(e.tx, c.Key, normEnd(c.RangeEnd), e.rev, &e.ov)
	if err != nil {
		return false, err
	}
	if len(es) == 0 {
		if c.Target == pb.Compare_VALUE {
			return false, nil
		}
		return compareEntry(c, &entry{}), nil
	}
	if c.Target == pb.Compare_VALUE {
		if err := e.resolve(es); err != nil {
			return false, err
		}
	}
	for _, x := range es {
		if !compareEntry(c, x) {
			return false, nil
		}
	}
	return true, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareEntry(c *pb.Compare, x *entry) bool {
	var result int
	switch c.Target {
	case pb.Compare_VALUE:
		result = bytes.Compare(x.value, c.GetValue())
	case pb.Compare_CREATE:
		result = cmpInt(x.meta.CreateRev, c.GetCreateRevision())
	case pb.Compare_MOD:
		result = cmpInt(x.meta.ModRev, c.GetModRevision())
	case pb.Compare_VERSION:
		result = cmpInt(x.meta.Version, c.GetVersion())
	case pb.Compare_LEASE:
		result = cmpInt(x.meta.Lease, c.GetLease())
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return result == 0
	case pb.Compare_NOT_EQUAL:
		return result != 0
	case pb.Compare_GREATER:
		return result > 0
	case pb.Compare_LESS:
		return result < 0
	}
	return true
}

func (e *evaluator) checkTxn(rt *pb.TxnRequest, path []bool) (int, error) {
	txns := 0
	ops := rt.Success
	if !path[0] {
		ops = rt.Failure
	}
	for _, op := range ops {
		var err error
		switch tv := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			err = e.checkRange(tv.RequestRange)
		case *pb.RequestOp_RequestPut:
			err = e.checkPut(tv.RequestPut)
		case *pb.RequestOp_RequestTxn:
			var n int
			n, err = e.checkTxn(tv.RequestTxn, path[1:])
			txns += n + 1
			path = path[n+1:]
		}
		if err != nil {
			return 0, err
		}
	}
	return txns, nil
}

func (e *evaluator) checkPut(p *pb.PutRequest) error {
	if err := e.checkKey(p.Key); err != nil {
		return err
	}
	if p.IgnoreValue || p.IgnoreLease {
		prev, err := e.get(p.Key)
		if err != nil {
			return err
		}
		if prev == nil {
			return ErrKeyNotFound
		}
	}
	return e.checkLease(p.Lease)
}

// newTxnResp shapes the response tree along the chosen path; nested txn
// responses keep an empty header, as etcd's do.
func (e *evaluator) newTxnResp(rt *pb.TxnRequest, path []bool) (*pb.TxnResponse, int, error) {
	ops := rt.Success
	if !path[0] {
		ops = rt.Failure
	}
	resp := &pb.TxnResponse{Succeeded: path[0], Header: &pb.ResponseHeader{}, Responses: make([]*pb.ResponseOp, len(ops))}
	count := 0
	for i, op := range ops {
		switch tv := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{}}
		case *pb.RequestOp_RequestPut:
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{}}
		case *pb.RequestOp_RequestDeleteRange:
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{}}
		case *pb.RequestOp_RequestTxn:
			sub, n, err := e.newTxnResp(tv.RequestTxn, path[1:])
			if err != nil {
				return nil, 0, err
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: sub}}
			path = path[1+n:]
			count += n + 1
		}
	}
	return resp, count, nil
}

func (e *evaluator) executeTxn(rt *pb.TxnRequest, path []bool, resp *pb.TxnResponse) (int, error) {
	ops := rt.Success
	if !path[0] {
		ops = rt.Failure
	}
	txns := 0
	for i, op := range ops {
		slot := resp.Responses[i].Response
		switch tv := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
			r, err := e.rangeOp(tv.RequestRange)
			if err != nil {
				return 0, err
			}
			slot.(*pb.ResponseOp_ResponseRange).ResponseRange = r
		case *pb.RequestOp_RequestPut:
			r, err := e.put(tv.RequestPut)
			if err != nil {
				return 0, err
			}
			slot.(*pb.ResponseOp_ResponsePut).ResponsePut = r
		case *pb.RequestOp_RequestDeleteRange:
			r, err := e.deleteRange(tv.RequestDeleteRange)
			if err != nil {
				return 0, err
			}
			slot.(*pb.ResponseOp_ResponseDeleteRange).ResponseDeleteRange = r
		case *pb.RequestOp_RequestTxn:
			sub := slot.(*pb.ResponseOp_ResponseTxn).ResponseTxn
			n, err := e.executeTxn(tv.RequestTxn, path[1:], sub)
			if err != nil {
				return 0, err
			}
			txns += n + 1
			path = path[n+1:]
		}
	}
	return txns, nil
}
