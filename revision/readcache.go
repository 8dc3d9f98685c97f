package revision

import (
	"bytes"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// cachedTx answers an attempt's reads of the keys it read ahead (the head
// and Prefetcher keys) from memory, as the transaction sees them: the value
// read, or what the attempt wrote there since.
//
// FoundationDB's client would answer them from its read-your-writes cache
// too, but each read is still a cgo call and a message to the client's one
// network thread and back, which the evaluation waits for in sequence:
// under load that thread is busy committing and reading for everyone, and a
// batch of 130 puts spent 10 ms on those hops, five times its read round
// trip. The key was read in this transaction (not as a snapshot), so its
// conflict range is already there and answering from memory changes
// nothing FoundationDB checks at commit.
type cachedTx struct {
	storage.Tx
	vals map[string][]byte // guarded by the attempt (one goroutine)
}

// newCachedTx caches vals, read at keys in tx.
func newCachedTx(tx storage.Tx, keys, vals [][]byte) *cachedTx {
	c := &cachedTx{Tx: tx, vals: make(map[string][]byte, len(keys))}
	for i, k := range keys {
		c.vals[string(k)] = vals[i]
	}
	return c
}

func (c *cachedTx) Get(key []byte) ([]byte, error) {
	if v, ok := c.vals[string(key)]; ok {
		return v, nil
	}
	return c.Tx.Get(key)
}

// GetMany reads the keys it has not cached in one call to the storage.
func (c *cachedTx) GetMany(keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	var missed [][]byte
	var at []int
	for i, k := range keys {
		if v, ok := c.vals[string(k)]; ok {
			out[i] = v
			continue
		}
		missed, at = append(missed, k), append(at, i)
	}
	if len(missed) == 0 {
		return out, nil
	}
	vals, err := c.Tx.GetMany(missed)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		out[i] = vals[j]
	}
	return out, nil
}

// Set keeps a cached key's entry current; a key not cached is read from the
// storage, which sees the write.
func (c *cachedTx) Set(key, value []byte) {
	c.Tx.Set(key, value)
	if _, ok := c.vals[string(key)]; ok {
		c.vals[string(key)] = bytes.Clone(value) // Set copies its arguments
	}
}

func (c *cachedTx) Clear(key []byte) {
	c.Tx.Clear(key)
	if _, ok := c.vals[string(key)]; ok {
		c.vals[string(key)] = nil
	}
}

// ClearRange forgets the cached keys in the range: the storage answers them.
func (c *cachedTx) ClearRange(begin, end []byte) {
	c.Tx.ClearRange(begin, end)
	for k := range c.vals {
		if k >= string(begin) && k < string(end) {
			delete(c.vals, k)
		}
	}
}
