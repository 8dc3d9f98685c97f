package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"sort"
)

// HashKV hashes the key-value history retained up to rev exactly as etcd
// 3.6's HashByRev does over its backend: the revision keys and marshaled
// KeyValues of the history etcd's compaction keeps (see WalkRetained), in
// revision order, CRC-32C; versions at or below the compaction revision only
// when they are in etcd's Keep(rev) — a key's newest version at rev, not a
// tombstone — unless no key has one; never a tombstone at the compaction
// revision. rev 0 means the current revision.
func (s *Store) HashKV(ctx context.Context, rev int64) (hash uint32, hashRev, compactRev int64, err error) {
	head, compacted, err := s.Rev(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	if rev == 0 {
		rev = head
	}
	if rev > head {
		return 0, 0, 0, ErrFutureRev
	}
	if rev < compacted {
		return 0, 0, 0, ErrCompacted
	}
	items, keeps, err := s.hashItems(ctx, rev, compacted)
	if errors.Is(err, ErrCompactionMoved) {
		err = ErrCompacted
	}
	if err != nil {
		return 0, 0, 0, err
	}
	return hashOf(items, keeps, compacted), rev, compacted, nil
}

// hashItem is one version as etcd's hash reads it from its key bucket.
type hashItem struct {
	k, v []byte
	keep bool // in etcd's Keep(rev)
}

// hashItems lists the versions retained at rev, in key order, and counts
// those in etcd's Keep(rev): each key's newest, unless a tombstone.
func (s *Store) hashItems(ctx context.Context, rev, compacted int64) (items []hashItem, keeps int, err error) {
	var lastKey []byte
	err = s.WalkRetained(ctx, rev, compacted, func(rv RetainedVersion) error {
		// The walk is in key order, so a key's last version is its newest.
		key := rv.KV.Key
		if n := len(items); n > 0 && bytes.Equal(key, lastKey) && items[n-1].keep {
			items[n-1].keep = false
			keeps--
		}
		v, err := rv.Marshal()
		if err != nil {
			return err
		}
		items = append(items, hashItem{k: rv.RevisionKey(), v: v, keep: !rv.Tombstone})
		if !rv.Tombstone {
			keeps++
		}
		lastKey = key
		return nil
	})
	return items, keeps, err
}

// hashOf hashes items in revision order as etcd's HashKV does.
func hashOf(items []hashItem, keeps int, compacted int64) uint32 {
	sort.Slice(items, func(i, j int) bool { return bytes.Compare(items[i].k, items[j].k) < 0 })
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key"))
	for _, it := range items {
		main := int64(binary.BigEndian.Uint64(it.k))
		if main <= compacted && keeps > 0 && !it.keep {
			continue
		}
		if main == compacted && len(it.k) == 18 {
			continue
		}
		h.Write(it.k)
		h.Write(it.v)
	}
	return h.Sum32()
}
