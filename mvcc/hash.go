package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"sort"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// HashKV hashes the key-value history retained up to rev with the same
// inputs as etcd (its backend's revision keys and marshaled KeyValues, in
// revision order, CRC-32C), so that a store holding the same history as an
// etcd node reports the same hash. rev 0 means the current revision.
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
	type item struct {
		k []byte
		v []byte
	}
	var items []item
	begin, end := keyspace.HistoryAll()
	for begin != nil {
		var page []*entry
		var tomb []bool
		var subs []int64
		var next []byte
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			page, tomb, subs, next = nil, nil, nil, nil
			kvs, err := tx.GetRange(begin, end, storage.RangeOptions{Limit: 2_000})
			if err != nil {
				return err
			}
			for _, kv := range kvs {
				key, modRev, err := keyspace.ParseHistory(kv.Key)
				if err != nil {
					return err
				}
				if modRev > rev {
					continue
				}
				v, err := decodeVersion(kv.Value)
				if err != nil {
					return err
				}
				if v.Tombstone && modRev == compacted {
					continue // etcd skips it: versions disagree on keeping it
				}
				page = append(page, &entry{key: key, meta: v.meta(modRev), ver: &v})
				tomb = append(tomb, v.Tombstone)
				subs = append(subs, v.Sub)
			}
			if len(kvs) == 2_000 {
				next = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
			}
			return resolveValues(tx, page)
		})
		if err != nil {
			return 0, 0, 0, err
		}
		for i, e := range page {
			k := make([]byte, 0, 18)
			k = binary.BigEndian.AppendUint64(k, uint64(e.meta.ModRev))
			k = append(k, '_')
			k = binary.BigEndian.AppendUint64(k, uint64(subs[i]))
			kv := &mvccpb.KeyValue{Key: e.key}
			if tomb[i] {
				k = append(k, 't')
			} else {
				kv = e.kv(true)
			}
			v, err := proto.MarshalOptions{Deterministic: true}.Marshal(kv)
			if err != nil {
				return 0, 0, 0, err
			}
			items = append(items, item{k: k, v: v})
		}
		begin = next
	}
	sort.Slice(items, func(i, j int) bool { return bytes.Compare(items[i].k, items[j].k) < 0 })
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key"))
	for _, it := range items {
		h.Write(it.k)
		h.Write(it.v)
	}
	return h.Sum32(), rev, compacted, nil
}
