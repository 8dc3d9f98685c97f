package storage

import "bytes"

// CachedTx answers a transaction's reads of keys it has already read
// from memory, as the transaction sees them: the value read, or what it
// wrote there since. Reads of other keys, and ranges, go to the
// transaction.
//
// FoundationDB's client would answer them from its read-your-writes cache
// too, but each read is still a cgo call and a message to the client's one
// network thread and back, which a caller waits for in sequence: under
// load that thread is busy committing and reading for everyone, and a
// batch of 130 puts spent 10 ms on those hops, five times its read round
// trip. The keys were read in this transaction (not as a snapshot), so
// their conflict ranges are already there and answering from memory
// changes nothing FoundationDB checks at commit.
//
// Unlike a transaction's, its answers for cached keys share the cached
// bytes (a value can be large, and every caller only reads it): they must
// not be modified.
type CachedTx struct {
	Tx
	vals map[string][]byte // guarded by the transaction's one goroutine
}

// NewCachedTx caches vals, read at keys in tx.
func NewCachedTx(tx Tx, keys, vals [][]byte) *CachedTx {
	c := &CachedTx{Tx: tx, vals: make(map[string][]byte, len(keys))}
	for i, k := range keys {
		c.vals[string(k)] = vals[i]
	}
	return c
}

func (c *CachedTx) Get(key []byte) ([]byte, error) {
	if v, ok := c.vals[string(key)]; ok {
		return v, nil
	}
	return c.Tx.Get(key)
}

// GetMany reads the keys it has not cached in one call to the storage.
func (c *CachedTx) GetMany(keys [][]byte) ([][]byte, error) {
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
func (c *CachedTx) Set(key, value []byte) {
	c.Tx.Set(key, value)
	if _, ok := c.vals[string(key)]; ok {
		c.vals[string(key)] = bytes.Clone(value) // Set copies its arguments
	}
}

func (c *CachedTx) Clear(key []byte) {
	c.Tx.Clear(key)
	if _, ok := c.vals[string(key)]; ok {
		c.vals[string(key)] = nil
	}
}

// ClearRange forgets the cached keys in the range: the storage answers them.
func (c *CachedTx) ClearRange(begin, end []byte) {
	c.Tx.ClearRange(begin, end)
	for k := range c.vals {
		if k >= string(begin) && k < string(end) {
			delete(c.vals, k)
		}
	}
}
