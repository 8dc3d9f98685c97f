package kv

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The validators reject exactly what etcd's v3rpc layer rejects, with its
// errors, before anything reaches the store.

// ValidateRange checks a RangeRequest.
func ValidateRange(r *pb.RangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.SortOrder)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.SortTarget)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

// ValidatePut checks a PutRequest.
func ValidatePut(r *pb.PutRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if r.IgnoreValue && len(r.Value) != 0 {
		return rpctypes.ErrGRPCValueProvided
	}
	if r.IgnoreLease && r.Lease != 0 {
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

// ValidateDeleteRange checks a DeleteRangeRequest.
func ValidateDeleteRange(r *pb.DeleteRangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	return nil
}

// ValidateTxn checks a TxnRequest: op counts, every nested op, and that no
// key is written twice along any path (etcd's duplicate-key rule).
func ValidateTxn(r *pb.TxnRequest, maxTxnOps int) error {
	if err := checkTxn(r, maxTxnOps); err != nil {
		return err
	}
	if _, _, err := checkIntervals(r.Success); err != nil {
		return err
	}
	if _, _, err := checkIntervals(r.Failure); err != nil {
		return err
	}
	return nil
}

func checkTxn(r *pb.TxnRequest, maxTxnOps int) error {
	opc := max(len(r.Compare), len(r.Success), len(r.Failure))
	if opc > maxTxnOps {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.Compare {
		if len(c.Key) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := checkOp(op, maxTxnOps-opc); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkOp(op *pb.RequestOp, maxTxnOps int) error {
	switch v := op.Request.(type) {
	case *pb.RequestOp_RequestRange:
		return ValidateRange(v.RequestRange)
	case *pb.RequestOp_RequestPut:
		return ValidatePut(v.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		return ValidateDeleteRange(v.RequestDeleteRange)
	case *pb.RequestOp_RequestTxn:
		return checkTxn(v.RequestTxn, maxTxnOps)
	default:
		return rpctypes.ErrGRPCKeyNotFound
	}
}

// interval is [begin, end); an empty end is unbounded. A point is
// [k, k+"\x00").
type interval struct{ begin, end string }

func (iv interval) contains(k string) bool {
	return iv.begin <= k && (iv.end == "" || k < iv.end)
}

type intervals []interval

func (ivs intervals) contains(k string) bool {
	for _, iv := range ivs {
		if iv.contains(k) {
			return true
		}
	}
	return false
}

// checkIntervals returns the keys put and the ranges deleted by ops (nested
// txns included) and fails if a put collides with another put or a delete on
// the same path.
func checkIntervals(ops []*pb.RequestOp) (map[string]struct{}, intervals, error) {
	var dels intervals
	for _, op := range ops {
		d := op.GetRequestDeleteRange()
		if d == nil {
			continue
		}
		if len(d.RangeEnd) != 0 {
			dels = append(dels, interval{string(d.Key), string(d.RangeEnd)})
		} else {
			dels = append(dels, interval{string(d.Key), string(d.Key) + "\x00"})
		}
	}
	puts := map[string]struct{}{}
	for _, op := range ops {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.Success)
		if err != nil {
			return nil, dels, err
		}
		putsElse, delsElse, err := checkIntervals(t.Failure)
		if err != nil {
			return nil, dels, err
		}
		for k := range putsThen {
			if _, ok := puts[k]; ok || dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, ok := puts[k]; ok {
				if _, sameBranchKey := putsThen[k]; !sameBranchKey {
					return nil, dels, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(dels, delsThen...)
		dels = append(dels, delsElse...)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if _, ok := puts[k]; ok || dels.contains(k) {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}
