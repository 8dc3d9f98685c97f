package mvcc

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// A Range that needs several read transactions reads every one of them at
// the revision its first page fixed. etcd reads a range in one read
// transaction, which a compaction cannot disturb; here a compaction may pass
// that revision between two pages, and physical compaction would then remove
// versions the later pages need. A read pin prevents that: a key written by
// the Range that holds physical compaction at the compaction revision
// requested when it was written, so every version a read at that revision or
// later needs stays until the pin goes.
//
// The pin is written in a transaction that reads the compaction record, so
// its floor is the requested compaction revision as of its commit, and no
// later: a compaction requested meanwhile makes it retry. The compactor
// reads the pins with the compaction record (compactTarget) and goes no
// further than the lowest; a pin committed after that read has a floor at
// least as high as the revision the compactor then read, so the steps that
// follow cannot pass it either. A pin is written only by a Range that needs
// a second transaction, so a Range read in one (a LIST page, a GET) costs
// nothing.
//
// A process may stop without removing its pins, so the compactor ignores
// and clears a pin it first saw ReadPinWindow ago (compactTarget); a Range
// relies on its pin only for that long after it started writing it, which
// is before any compactor could see it.

// readPin is a pin this store holds: floor is the compaction revision it
// holds physical compaction at, since the time it was requested.
type readPin struct {
	key   []byte
	floor int64
	since time.Time
}

// pinReads writes a read pin at the requested compaction revision.
func (s *Store) pinReads(ctx context.Context) (*readPin, error) {
	since := s.cfg.Now()
	id := rand.Uint64()
	var floor int64
	err := s.db.Update(ctx, func(tx storage.Tx) error {
		v, err := tx.Get(keyspace.Compaction)
		if err != nil {
			return err
		}
		c, err := decodeCompaction(v)
		if err != nil {
			return err
		}
		floor = max(c.Requested, 0) // -1 before the first compaction
		tx.Set(keyspace.ReadPin(floor, id), nil)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &readPin{key: keyspace.ReadPin(floor, id), floor: floor, since: since}, nil
}

// pinLive reports whether p may still be relied on: the compactor clears a
// pin only ReadPinWindow after it first saw it.
func (s *Store) pinLive(p *readPin) bool {
	return p != nil && s.cfg.Now().Sub(p.since) < s.cfg.ReadPinWindow
}

// unpin removes p, even when the Range's own context has ended, and lets
// physical compaction go on.
func (s *Store) unpin(p *readPin) {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	err := s.db.Update(ctx, func(tx storage.Tx) error {
		tx.Clear(p.key)
		return nil
	})
	if err != nil {
		// The compactor clears it once ReadPinWindow has passed.
		s.lg.Debug("removing a read pin failed")
	}
	s.wakeCompactor()
}

// maxPins bounds the pins one look of the compactor reads: the lowest, the
// ones that hold it back; the pins above are at or above their floors.
const maxPins = 1024

// readPins reads the lowest maxPins pins.
func readPins(tx storage.ReadTx) ([]holder, error) {
	b, e := keyspace.ReadPins()
	kvs, err := tx.GetRange(b, e, storage.RangeOptions{Limit: maxPins})
	if err != nil {
		return nil, err
	}
	pins := make([]holder, len(kvs))
	for i, kv := range kvs {
		rev, err := keyspace.ParseReadPin(kv.Key)
		if err != nil {
			return nil, err
		}
		pins[i] = holder{key: kv.Key, floor: rev}
	}
	return pins, nil
}
