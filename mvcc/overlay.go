package mvcc

import (
	"bytes"
	"sort"
)

// overlay holds one request's own pending writes. A request reads the store
// as of the revision before it, through this overlay, and applies its writes
// only once it has been fully evaluated. Because the store is never read
// through the request's own writes, the same evaluation can be replayed later
// against history and give the same answer.
type overlay struct {
	m map[string]*pendingKV
}

type pendingKV struct {
	key   []byte
	meta  meta
	value []byte
}

func (p *pendingKV) entry() *entry {
	return &entry{key: p.key, meta: p.meta, value: p.value, has: true,
		ver: &version{Chunks: 1, ValueLen: int64(len(p.value)), First: p.value,
			CreateRev: p.meta.CreateRev, Version: p.meta.Version, Lease: p.meta.Lease}}
}

func (o *overlay) get(key []byte) (*pendingKV, bool) {
	if o.m == nil {
		return nil, false
	}
	p, ok := o.m[string(key)]
	return p, ok
}

func (o *overlay) has(key []byte) bool {
	_, ok := o.get(key)
	return ok
}

func (o *overlay) len() int { return len(o.m) }

func (o *overlay) set(p *pendingKV) {
	if o.m == nil {
		o.m = make(map[string]*pendingKV)
	}
	o.m[string(p.key)] = p
}

// inRange returns the pending keys in [key, end) in key order; an empty end
// means no upper bound.
func (o *overlay) inRange(key, end []byte) []*pendingKV {
	var out []*pendingKV
	for _, p := range o.m {
		if bytes.Compare(p.key, key) >= 0 && (len(end) == 0 || bytes.Compare(p.key, end) < 0) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].key, out[j].key) < 0 })
	return out
}
