package mvcc

import (
	"bytes"
	"slices"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// normEnd turns an etcd range_end into the form the readers take: nil for a
// single key, an empty non-nil slice for "every key from key on" (range_end
// "\x00"), the end itself otherwise.
func normEnd(end []byte) []byte {
	switch {
	case len(end) == 0:
		return nil
	case len(end) == 1 && end[0] == 0:
		return []byte{}
	default:
		return end
	}
}

// keepFor is how many leading keys a Range must materialise: etcd fetches
// limit+1 keys unless it sorts (by sort_order, not target) or filters, in
// which case it needs all of them. -1 means all.
func keepFor(r *pb.RangeRequest) int {
	if r.CountOnly {
		return 0
	}
	if r.SortOrder != pb.RangeRequest_NONE ||
		r.MinModRevision != 0 || r.MaxModRevision != 0 ||
		r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return -1
	}
	if r.Limit > 0 {
		return int(r.Limit) + 1
	}
	return -1
}

// buildRange turns the kept keys of a range into etcd's response, applying
// filters, sort and limit exactly as etcd does; resolve reads the values of
// the entries it is given.
func buildRange(r *pb.RangeRequest, kept []*entry, count int, headerRev int64, resolve func([]*entry) error) (*pb.RangeResponse, error) {
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: headerRev}, Count: int64(count)}
	if r.CountOnly {
		return resp, nil
	}
	kept = slices.DeleteFunc(kept, outsideRevisions(r))
	if err := sortRange(r, kept, resolve); err != nil {
		return nil, err
	}
	if r.Limit > 0 && len(kept) > int(r.Limit) {
		kept = kept[:r.Limit]
		resp.More = true
	}
	if !r.KeysOnly {
		if err := resolve(kept); err != nil {
			return nil, err
		}
	}
	resp.Kvs = make([]*mvccpb.KeyValue, len(kept))
	for i, e := range kept {
		resp.Kvs[i] = e.kv(!r.KeysOnly)
	}
	return resp, nil
}

// outsideRevisions is r's filter on mod and create revisions: it reports
// the entries the response leaves out.
func outsideRevisions(r *pb.RangeRequest) func(e *entry) bool {
	return func(e *entry) bool {
		m := e.meta
		return r.MaxModRevision != 0 && m.ModRev > r.MaxModRevision ||
			r.MinModRevision != 0 && m.ModRev < r.MinModRevision ||
			r.MaxCreateRevision != 0 && m.CreateRev > r.MaxCreateRevision ||
			r.MinCreateRevision != 0 && m.CreateRev < r.MinCreateRevision
	}
}

// sortRange orders kept, which is in key order, as r asks: by a target
// other than the key ascending unless told otherwise, as etcd does. Sorting
// by value reads the values first.
func sortRange(r *pb.RangeRequest, kept []*entry, resolve func([]*entry) error) error {
	order := r.SortOrder
	if r.SortTarget != pb.RangeRequest_KEY && order == pb.RangeRequest_NONE {
		order = pb.RangeRequest_ASCEND
	} else if r.SortTarget == pb.RangeRequest_KEY && order == pb.RangeRequest_ASCEND {
		order = pb.RangeRequest_NONE // already in key order
	}
	if order == pb.RangeRequest_NONE {
		return nil
	}
	if r.SortTarget == pb.RangeRequest_VALUE {
		if err := resolve(kept); err != nil {
			return err
		}
	}
	s := entrySort{es: kept, target: r.SortTarget}
	if order == pb.RangeRequest_DESCEND {
		sort.Sort(sort.Reverse(s))
	} else {
		sort.Sort(s)
	}
	return nil
}

// entrySort orders like etcd's kvSort family, with sort.Sort, so that ties
// land in the same order as etcd's.
type entrySort struct {
	es     []*entry
	target pb.RangeRequest_SortTarget
}

func (s entrySort) Len() int      { return len(s.es) }
func (s entrySort) Swap(i, j int) { s.es[i], s.es[j] = s.es[j], s.es[i] }
func (s entrySort) Less(i, j int) bool {
	a, b := s.es[i], s.es[j]
	switch s.target {
	case pb.RangeRequest_VERSION:
		return a.meta.Version-b.meta.Version < 0
	case pb.RangeRequest_CREATE:
		return a.meta.CreateRev-b.meta.CreateRev < 0
	case pb.RangeRequest_MOD:
		return a.meta.ModRev-b.meta.ModRev < 0
	case pb.RangeRequest_VALUE:
		return bytes.Compare(a.value, b.value) < 0
	default:
		return bytes.Compare(a.key, b.key) < 0
	}
}
