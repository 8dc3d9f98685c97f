package lease

import (
	"bytes"
	"sync"
)

// renewCache keeps the lease records this lessor's keep-alives read, with
// the value of mvcc.LeaseRemovedKey they were read with. That key changes
// in every transaction that removes a record or may move a deadline
// earlier, so while a shared read finds it unchanged, every cached record
// still stands with at least its cached deadline: a keep-alive whose cached
// deadline covers now+TTL is answered from that read of the key and the
// head alone, without its record. The read still starts after the
// keep-alive arrived, so a revoke that completed before it is seen (the
// key changed) exactly as a read of the record would see it.
//
// It is bounded: past max entries, records are no longer added until the
// next change of the key empties it.
type renewCache struct {
	max int

	mu      sync.Mutex
	known   bool             // guarded by mu: mark is the key's value as last read
	mark    []byte           // guarded by mu
	records map[int64][]byte // guarded by mu: raw records read while the key was mark
}

func newRenewCache(max int) *renewCache {
	return &renewCache{max: max, records: map[int64][]byte{}}
}

// lookup returns, for each of ids, its cached record if that record's
// deadline covers now+TTL at now (unix microseconds), else nil; and the
// key's value those records were read with (ok false if none was read
// yet). The records may be trusted only by a read that finds the key
// still at mark.
func (c *renewCache) lookup(ids []int64, now int64) (mark []byte, ok bool, raws [][]byte) {
	raws = make([][]byte, len(ids))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		raw := c.records[id]
		if raw == nil {
			continue
		}
		if rec, err := decodeRecord(raw); err == nil && rec.Deadline >= addSat(now, ttlDuration(rec.TTL)) {
			raws[i] = raw
		}
	}
	return c.mark, c.known, raws
}

// update records what one shared read found: the key's value and the
// records it read (nil for a lease without one). A changed key empties the
// cache first.
func (c *renewCache) update(mark []byte, ids []int64, raws [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known || !bytes.Equal(c.mark, mark) {
		c.known, c.mark = true, mark
		clear(c.records)
	}
	for i, id := range ids {
		switch {
		case raws[i] == nil:
			delete(c.records, id)
		case len(c.records) < c.max || c.records[id] != nil:
			c.records[id] = raws[i]
		}
	}
}
