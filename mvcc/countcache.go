package mvcc

import (
	"bytes"
	"sync"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// countCache keeps range counts so that a count does not have to scan the
// range. etcd answers counts from its in-memory index; scanning a 50k-key
// range instead took twice etcd's time for a count-only request and made
// paginated lists quadratic, since every page of a limited range reports the
// total of [page start, end).
//
// An entry is the exact count of [start, end) at a revision. It serves:
//   - the same range at the same revision: exactly;
//   - the same range at a later revision: the entry plus the creations minus
//     the deletions in the revision log between the two revisions, which is
//     far shorter than the range for ranges that are counted repeatedly
//     (kube-apiserver's object counts) — unless compaction has removed that
//     part of the log or it is long, when the range is scanned again;
//   - the next page of a paginated range at a fixed revision: a page leaves
//     behind the count of [last key + "\x00", end), its count minus the keys
//     it returned, since a limited range returns the first live keys in order.
//
// Past revisions never change (compaction makes them unreadable instead,
// which every read still checks), so entries need no invalidation.
type countCache struct {
	mu    sync.Mutex
	m     map[countKey]countEntry
	order []countKey // insertion order, for FIFO eviction
	next  int
}

type countKey struct{ start, end string }

type countEntry struct{ rev, count int64 }

const (
	// countCacheEntries bounds the cache: a handful per resource type and
	// per paginated list in progress.
	countCacheEntries = 4096
	// maxCountCatchUp is the most log revisions a count catches up on
	// before it scans the range instead, keeping the read transaction short.
	maxCountCatchUp = 10_000
)

func newCountCache() *countCache {
	// Not presized: a full-size map is 0.4 MiB that most servers never use.
	return &countCache{m: make(map[countKey]countEntry)}
}

func (c *countCache) get(start, end []byte) (countEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[countKey{string(start), string(end)}]
	return e, ok
}

// put records the count of [start, end) at rev unless a later one is known.
func (c *countCache) put(start, end []byte, rev, count int64) {
	k := countKey{string(start), string(end)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[k]; ok {
		if old.rev < rev {
			c.m[k] = countEntry{rev, count}
		}
		return
	}
	if len(c.order) < countCacheEntries {
		c.order = append(c.order, k)
	} else {
		delete(c.m, c.order[c.next])
		c.order[c.next] = k
		c.next = (c.next + 1) % countCacheEntries
	}
	c.m[k] = countEntry{rev, count}
}

// countAt returns the count of [start, rawEnd) at rev from the cache,
// catching up through the revision log in tx; ok is false when the range
// must be scanned.
func (c *countCache) countAt(tx storage.ReadTx, start, rawEnd []byte, rev int64, comp compaction) (int64, bool, error) {
	e, ok := c.get(start, rawEnd)
	switch {
	case !ok || e.rev > rev:
		return 0, false, nil
	case e.rev == rev:
		return e.count, true, nil
	case e.rev < comp.Requested || rev-e.rev > maxCountCatchUp:
		return 0, false, nil // the log since e.rev may be gone, or is long
	}
	end := normEnd(rawEnd)
	in := func(k []byte) bool {
		return bytes.Compare(k, start) >= 0 && (len(end) == 0 || bytes.Compare(k, end) < 0)
	}
	parts, err := tx.GetRange(keyspace.LogFrom(e.rev+1), keyspace.LogFrom(rev+1), storage.RangeOptions{})
	if err != nil {
		return 0, false, err
	}
	n := e.count
	for _, p := range parts {
		_, part, err := keyspace.ParseLog(p.Key)
		if err != nil {
			return 0, false, err
		}
		evs, err := decodeLogPart(p.Value, part == 0)
		if err != nil {
			return 0, false, err
		}
		for _, ev := range evs {
			switch {
			case !in(ev.Key):
			case ev.Type == evPut && ev.PrevRev == 0:
				n++ // created (or recreated after a delete)
			case ev.Type == evDelete && ev.PrevRev != 0:
				n--
			}
		}
	}
	return n, true, nil
}
