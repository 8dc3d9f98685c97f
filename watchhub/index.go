package watchhub

import (
	"bytes"
	"math/rand/v2"
	"sort"
	"strings"
)

// index finds the watchers interested in a key without comparing the key
// with every watcher. Watchers with the same range share a group; groups
// are found by
//
//   - single keys: a map from key to group;
//   - prefixes ([p, p+1), what clientv3.WithPrefix sends): a map from prefix
//     to group, probed once per distinct prefix length (kube-apiserver's
//     prefixes come in a handful of lengths);
//   - every other range, from-key ranges included: an interval treap
//     augmented with the largest end of each subtree, so a stabbing query
//     costs O(log n + matches).
type index struct {
	exact  map[string]*group
	prefix map[string]*group
	plens  map[int]int // prefix length -> groups of that length
	lens   []int       // sorted keys of plens
	ranges map[rangeKey]*group
	tree   *inode
	size   int
	prevKV int // watchers that want previous values
	// track maintains each watcher's position in its group so it can be
	// removed in O(1); a throw-away index (a catch-up round) skips it and
	// never removes.
	track bool
}

type groupKind uint8

const (
	kindExact groupKind = iota
	kindPrefix
	kindRange
)

type rangeKey struct {
	start, end string
	inf        bool // from-key: no end
}

type group struct {
	kind groupKind
	key  string
	rk   rangeKey
	ws   []*Watcher
}

func newIndex(track bool) *index {
	return &index{
		exact:  map[string]*group{},
		prefix: map[string]*group{},
		plens:  map[int]int{},
		ranges: map[rangeKey]*group{},
		track:  track,
	}
}

// prefixEnd is the end of the prefix range of p, nil if p has none.
func prefixEnd(p []byte) []byte {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] != 0xff {
			end := make([]byte, i+1)
			copy(end, p[:i+1])
			end[i]++
			return end
		}
	}
	return nil
}

func classify(key, end []byte) (groupKind, rangeKey) {
	switch {
	case end == nil:
		return kindExact, rangeKey{}
	case len(end) == 0:
		return kindRange, rangeKey{start: string(key), inf: true}
	case len(key) > 0 && bytes.Equal(end, prefixEnd(key)):
		return kindPrefix, rangeKey{}
	default:
		return kindRange, rangeKey{start: string(key), end: string(end)}
	}
}

func (ix *index) add(w *Watcher) {
	kind, rk := classify(w.key, w.end)
	var g *group
	switch kind {
	case kindExact:
		g = ix.exact[string(w.key)]
		if g == nil {
			g = &group{kind: kind, key: string(w.key)}
			ix.exact[g.key] = g
		}
	case kindPrefix:
		g = ix.prefix[string(w.key)]
		if g == nil {
			g = &group{kind: kind, key: string(w.key)}
			ix.prefix[g.key] = g
			ix.addLen(len(w.key))
		}
	case kindRange:
		g = ix.ranges[rk]
		if g == nil {
			g = &group{kind: kind, rk: rk}
			ix.ranges[rk] = g
			ix.tree = treapInsert(ix.tree, &inode{rk: rk, g: g, prio: rand.Uint64()})
		}
	}
	if ix.track {
		w.grp, w.gpos = g, len(g.ws)
	}
	g.ws = append(g.ws, w)
	ix.size++
	if w.prevKV {
		ix.prevKV++
	}
}

func (ix *index) remove(w *Watcher) {
	g := w.grp
	if g == nil || !ix.track {
		panic("watchhub: removing a watcher that is not indexed")
	}
	last := len(g.ws) - 1
	if g.ws[w.gpos] != w {
		panic("watchhub: index position out of date")
	}
	g.ws[w.gpos] = g.ws[last]
	g.ws[w.gpos].gpos = w.gpos
	g.ws[last] = nil
	g.ws = g.ws[:last]
	w.grp, w.gpos = nil, 0
	ix.size--
	if w.prevKV {
		ix.prevKV--
	}
	if len(g.ws) > 0 {
		return
	}
	switch g.kind {
	case kindExact:
		delete(ix.exact, g.key)
	case kindPrefix:
		delete(ix.prefix, g.key)
		ix.removeLen(len(g.key))
	case kindRange:
		delete(ix.ranges, g.rk)
		ix.tree = treapDelete(ix.tree, g.rk)
	}
}

func (ix *index) addLen(n int) {
	ix.plens[n]++
	if ix.plens[n] == 1 {
		ix.lens = append(ix.lens, n)
		sort.Ints(ix.lens)
	}
}

func (ix *index) removeLen(n int) {
	ix.plens[n]--
	if ix.plens[n] > 0 {
		return
	}
	delete(ix.plens, n)
	for i, l := range ix.lens {
		if l == n {
			ix.lens = append(ix.lens[:i], ix.lens[i+1:]...)
			break
		}
	}
}

// match appends to out the groups whose range holds key.
func (ix *index) match(key []byte, out []*group) []*group {
	if g := ix.exact[string(key)]; g != nil {
		out = append(out, g)
	}
	for _, n := range ix.lens {
		if n > len(key) {
			break
		}
		if g := ix.prefix[string(key[:n])]; g != nil {
			out = append(out, g)
		}
	}
	if ix.tree != nil {
		out = ix.tree.stab(key, out)
	}
	return out
}

// each calls fn for every indexed watcher.
func (ix *index) each(fn func(w *Watcher)) {
	for _, m := range []map[string]*group{ix.exact, ix.prefix} {
		for _, g := range m {
			for _, w := range g.ws {
				fn(w)
			}
		}
	}
	for _, g := range ix.ranges {
		for _, w := range g.ws {
			fn(w)
		}
	}
}

// inode is a node of the interval treap: ordered by (start, end), a heap on
// prio, and augmented with the largest end in its subtree.
type inode struct {
	rk          rangeKey
	g           *group
	prio        uint64
	left, right *inode
	maxEnd      string
	maxInf      bool
}

func cmpRange(a, b rangeKey) int {
	if c := strings.Compare(a.start, b.start); c != 0 {
		return c
	}
	switch {
	case a.inf && b.inf:
		return 0
	case a.inf:
		return 1
	case b.inf:
		return -1
	}
	return strings.Compare(a.end, b.end)
}

func (n *inode) update() {
	n.maxEnd, n.maxInf = n.rk.end, n.rk.inf
	for _, c := range [2]*inode{n.left, n.right} {
		if c == nil {
			continue
		}
		if c.maxInf {
			n.maxInf = true
		} else if c.maxEnd > n.maxEnd {
			n.maxEnd = c.maxEnd
		}
	}
}

// split divides t into the nodes ordered before k and the rest.
func treapSplit(t *inode, k rangeKey) (l, r *inode) {
	if t == nil {
		return nil, nil
	}
	if cmpRange(t.rk, k) < 0 {
		t.right, r = treapSplit(t.right, k)
		t.update()
		return t, r
	}
	l, t.left = treapSplit(t.left, k)
	t.update()
	return l, t
}

func treapMerge(l, r *inode) *inode {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = treapMerge(l.right, r)
		l.update()
		return l
	default:
		r.left = treapMerge(l, r.left)
		r.update()
		return r
	}
}

func treapInsert(t, n *inode) *inode {
	if t == nil {
		n.update()
		return n
	}
	if n.prio > t.prio {
		n.left, n.right = treapSplit(t, n.rk)
		n.update()
		return n
	}
	if cmpRange(n.rk, t.rk) < 0 {
		t.left = treapInsert(t.left, n)
	} else {
		t.right = treapInsert(t.right, n)
	}
	t.update()
	return t
}

func treapDelete(t *inode, k rangeKey) *inode {
	if t == nil {
		return nil
	}
	switch c := cmpRange(k, t.rk); {
	case c == 0:
		return treapMerge(t.left, t.right)
	case c < 0:
		t.left = treapDelete(t.left, k)
	default:
		t.right = treapDelete(t.right, k)
	}
	t.update()
	return t
}

// stab appends the groups of every interval holding key.
func (t *inode) stab(key []byte, out []*group) []*group {
	if t == nil {
		return out
	}
	// string(key) in a comparison does not allocate.
	if !t.maxInf && t.maxEnd <= string(key) {
		return out // every interval below ends at or before key
	}
	out = t.left.stab(key, out)
	if t.rk.start > string(key) {
		return out // this and every later interval starts after key
	}
	if t.rk.inf || t.rk.end > string(key) {
		out = append(out, t.g)
	}
	return t.right.stab(key, out)
}
