package mvcc

import "sync"

// countCache makes paginated ranges count in O(page) instead of O(range).
// etcd returns the total count of [key, end) with every page, and pages
// such as kube-apiserver's (limit, then key = last key + "\x00" at the first
// page's revision) would otherwise each re-count the whole rest of the range:
// quadratic in the number of pages. At a fixed revision the count after a page
// is exactly the page's count minus the keys it returned, because a limited,
// unsorted, unfiltered range returns the first live keys in key order. So
// each page leaves the count for the next one here. A past revision never
// changes (compaction makes it unreadable instead, which the read still
// checks), so entries need no invalidation, only a bound.
type countCache struct {
	mu    sync.Mutex
	m     map[countKey]int64
	order []countKey // insertion order, for FIFO eviction
	next  int
}

type countKey struct {
	start, end string
	rev        int64
}

// countCacheEntries bounds the cache: one entry per paginated list in
// progress is enough.
const countCacheEntries = 4096

func newCountCache() *countCache {
	return &countCache{m: make(map[countKey]int64, countCacheEntries)}
}

func (c *countCache) get(start, end []byte, rev int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[countKey{string(start), string(end), rev}]
	return n, ok
}

func (c *countCache) put(start, end []byte, rev, count int64) {
	k := countKey{string(start), string(end), rev}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	if len(c.order) < countCacheEntries {
		c.order = append(c.order, k)
	} else {
		delete(c.m, c.order[c.next])
		c.order[c.next] = k
		c.next = (c.next + 1) % countCacheEntries
	}
	c.m[k] = count
}
