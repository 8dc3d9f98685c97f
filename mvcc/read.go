package mvcc

import (
	"bytes"
	"errors"
	"slices"
	"sort"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// entry is one key live at the revision being read.
type entry struct {
	key  []byte
	meta meta
	// ver is the version record when it is already at hand (read from
	// history or pending in the request's overlay); nil means "read it by
	// key and meta.ModRev".
	ver   *version
	value []byte // full value once resolved
	has   bool   // value resolved
}

// scanLive calls fn for every key in [begin, end) that is live at rev, in key
// order, reading at most pageKeys index entries (0: no limit), until fn
// returns false. key is only valid during the call. It returns the key to resume from, or nil when the
// range is exhausted. Index entries newer than rev are resolved from history,
// so any retained revision reads exactly.
func scanLive(tx storage.ReadTx, begin, end []byte, rev int64, pageKeys int, pre *prefetched, fn func(key []byte, m meta, ver *version) bool) ([]byte, error) {
	lb, le := keyspace.LatestRange(begin, end)
	var (
		n    int
		last []byte
		ferr error
	)
	visit := func(k, v []byte) bool {
		n++
		m, err := decodeMeta(v)
		if err != nil {
			ferr = err
			return false
		}
		key := keyspace.LatestKey(k)
		more := true
		if live, ok := m.At(rev); ok {
			if live != nil {
				more = fn(key, *live, nil)
			}
		} else {
			e, err := versionAt(tx, key, rev)
			if err != nil {
				ferr = err
				return false
			}
			if e != nil {
				more = fn(key, e.meta, e.ver)
			}
		}
		if !more {
			return false
		}
		if pageKeys > 0 && n == pageKeys {
			last = append(bytes.Clone(key), 0)
			return false
		}
		return true
	}
	if pre != nil {
		for _, kv := range pre.rows {
			if !visit(kv.Key, kv.Value) {
				return last, ferr
			}
		}
		if pre.complete {
			return nil, ferr
		}
		if len(pre.rows) > 0 {
			lb = append(bytes.Clone(pre.rows[len(pre.rows)-1].Key), 0)
		}
	}
	limit := pageKeys
	if pageKeys > 0 {
		limit = pageKeys - n
	}
	if err := storage.Scan(tx, lb, le, limit, visit); err != nil {
		return nil, err
	}
	return last, ferr
}

// prefetched are the first index entries of a scan, read with the state
// (firstReads.index); complete when they are every entry up to its end.
type prefetched struct {
	rows     []storage.KeyValue
	complete bool
}

// versionAt returns key as of rev from history, or nil if it was absent.
func versionAt(tx storage.ReadTx, key []byte, rev int64) (*entry, error) {
	kvs, err := tx.GetRange(keyspace.HistoryPrefix(key), keyspace.History(key, rev+1),
		storage.RangeOptions{Limit: 1, Reverse: true})
	if err != nil || len(kvs) == 0 {
		return nil, err
	}
	_, modRev, err := keyspace.ParseHistory(kvs[0].Key)
	if err != nil {
		return nil, err
	}
	v, err := decodeVersion(kvs[0].Value)
	if err != nil {
		return nil, err
	}
	if v.Tombstone {
		return nil, nil
	}
	return &entry{key: key, meta: v.Meta(modRev), ver: &v}, nil
}

// getAt returns key as of rev, consulting the overlay first.
func getAt(tx storage.ReadTx, key []byte, rev int64, ov *overlay) (*entry, error) {
	if ov != nil {
		if p, ok := ov.get(key); ok {
			if p.meta.Tombstone {
				return nil, nil
			}
			return p.entry(), nil
		}
	}
	v, err := tx.Get(keyspace.Latest(key))
	if err != nil {
		return nil, err
	}
	return entryAt(tx, key, v, rev)
}

// entryAt is key's entry at rev, given the key's latest entry (nil when
// the key has none).
func entryAt(tx storage.ReadTx, key, latest []byte, rev int64) (*entry, error) {
	if latest == nil {
		return nil, nil
	}
	m, err := decodeMeta(latest)
	if err != nil {
		return nil, err
	}
	if live, ok := m.At(rev); ok {
		if live == nil {
			return nil, nil
		}
		return &entry{key: bytes.Clone(key), meta: *live}, nil
	}
	return versionAt(tx, key, rev)
}

// rangeAt collects the keys of a range as of rev inside one transaction,
// merged with the request's own pending writes. Single keys (empty end) are
// point reads; fromKey ranges have end == []byte{}.
func rangeAt(tx storage.ReadTx, key, end []byte, rev int64, ov *overlay) ([]*entry, error) {
	if end == nil {
		e, err := getAt(tx, key, rev, ov)
		if err != nil || e == nil {
			return nil, err
		}
		return []*entry{e}, nil
	}
	var out []*entry
	if len(end) > 0 && bytes.Compare(key, end) >= 0 {
		return nil, nil
	}
	cursor := key
	for cursor != nil {
		next, err := scanLive(tx, cursor, end, rev, 4096, nil, func(key []byte, m meta, ver *version) bool {
			if ov == nil || !ov.has(key) {
				out = append(out, &entry{key: bytes.Clone(key), meta: m, ver: ver})
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		cursor = next
	}
	if ov != nil && ov.len() > 0 {
		added := false
		for _, p := range ov.inRange(key, end) {
			if !p.meta.Tombstone {
				out = append(out, p.entry())
				added = true
			}
		}
		if added {
			sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].key, out[j].key) < 0 })
		}
	}
	return out, nil
}

// resolveValues fills in the values of entries, reading each version (and
// its chunks) by key and revision in a few batched reads.
func resolveValues(tx storage.ReadTx, es []*entry) error {
	if err := readVersionRecords(tx, es); err != nil {
		return err
	}
	var chunked []*entry
	for _, e := range es {
		switch {
		case e.has:
		case e.ver.Chunks == 1:
			e.value, e.has = e.ver.First, true
		default:
			chunked = append(chunked, e)
		}
	}
	return readChunks(tx, chunked)
}

// readChunks reads, in one batch, the chunks after the first of values
// split over several, and joins each value.
func readChunks(tx storage.ReadTx, chunked []*entry) error {
	if len(chunked) == 0 {
		return nil
	}
	var keys [][]byte
	for _, e := range chunked {
		for i := 1; i < e.ver.Chunks; i++ {
			keys = append(keys, keyspace.Chunk(e.key, e.meta.ModRev, i))
		}
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return err
	}
	for _, e := range chunked {
		v := make([]byte, 0, e.ver.ValueLen)
		v = append(v, e.ver.First...)
		for i := 1; i < e.ver.Chunks; i++ {
			if vals[0] == nil {
				return errCorrupt
			}
			v = append(v, vals[0]...)
			vals = vals[1:]
		}
		e.value, e.has = v, true
	}
	return nil
}

func (e *entry) kv(withValue bool) *mvccpb.KeyValue {
	kv := &mvccpb.KeyValue{
		Key:            e.key,
		CreateRevision: e.meta.CreateRev,
		ModRevision:    e.meta.ModRev,
		Version:        e.meta.Version,
		Lease:          e.meta.Lease,
	}
	if withValue {
		kv.Value = e.value
	}
	return kv
}

// scanVersionsMin is the fewest version records readVersionRecords reads
// with a range read rather than point reads.
const scanVersionsMin = 32

// readVersionRecords reads from history the version record of each entry
// whose value is still to be read and whose version is not known yet. Many records
// (a LIST's page) are read with range reads over the history of their
// keys, from the first wanted record to the last: FoundationDB serves a
// range of rows for little more than one point read, where thousands of
// point reads cost the storage server a request each (a LIST of 50,000
// keys took five times as long as the same bytes read as ranges). The
// rows between the wanted ones are other retained versions; each range
// read is bounded, and what they did not reach is read by key.
func readVersionRecords(tx storage.ReadTx, es []*entry) error {
	var missing []*entry
	for _, e := range es {
		if !e.has && e.ver == nil {
			missing = append(missing, e)
		}
	}
	if len(missing) >= scanVersionsMin {
		if err := scanVersions(tx, missing); err != nil {
			return err
		}
	}
	var need []*entry
	var keys [][]byte
	for _, e := range missing {
		if e.ver == nil {
			need = append(need, e)
			keys = append(keys, keyspace.History(e.key, e.meta.ModRev))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	vals, err := tx.GetMany(keys)
	if err != nil {
		return err
	}
	for i, e := range need {
		if vals[i] == nil {
			return errCorrupt
		}
		v, err := decodeVersion(vals[i])
		if err != nil {
			return err
		}
		e.ver = &v
	}
	return nil
}

// scanVersions fills in the version records of es that range reads over
// their keys' history reach, reading at most twice as many rows as es has
// entries. A store that visits a range in place (storage.Scanner: the
// embedded one) reads them in one pass. Elsewhere they are read as up to
// scanVersionsParts ranges of consecutive wanted keys, issued together
// (storage.ReadBatch): on FoundationDB one range is a chain of round trips
// that bring at most about 80 kB each, so a LIST's page of 2,000 values of
// 2 KB read as one range took 1.5 times as long as the same bytes as 16
// ranges at once. (On the embedded store the runs cost an iterator and a
// copy of every row each: 5–20 % more time per LIST.)
func scanVersions(tx storage.ReadTx, es []*entry) error {
	sorted := es
	if !slices.IsSortedFunc(es, compareEntryKeys) {
		sorted = slices.SortedFunc(slices.Values(es), compareEntryKeys)
	}
	want := make([][]byte, len(sorted))
	for i, e := range sorted {
		want[i] = keyspace.History(e.key, e.meta.ModRev)
	}
	if scansInPlace(tx) {
		m := versionMatcher{es: sorted, want: want}
		var ferr error
		err := storage.Scan(tx, want[0], append(bytes.Clone(want[len(want)-1]), 0), 2*len(want), func(k, v []byte) bool {
			more, err := m.visit(k, v, false)
			ferr = err
			return more && err == nil
		})
		return errors.Join(err, ferr)
	}
	per := max(scanVersionsPerPart, (len(want)+scanVersionsParts-1)/scanVersionsParts)
	var ranges []storage.RangeRead
	for lo := 0; lo < len(want); lo += per {
		hi := min(lo+per, len(want))
		ranges = append(ranges, storage.RangeRead{
			Begin: want[lo],
			End:   append(bytes.Clone(want[hi-1]), 0),
			Opt:   storage.RangeOptions{Limit: 2 * (hi - lo)},
		})
	}
	_, rows, err := storage.ReadBatch(tx, nil, ranges)
	if err != nil {
		return err
	}
	for p, kvs := range rows {
		lo, hi := p*per, min((p+1)*per, len(want))
		m := versionMatcher{es: sorted[lo:hi], want: want[lo:hi]}
		for _, kv := range kvs {
			more, err := m.visit(kv.Key, kv.Value, true)
			if err != nil {
				return err
			}
			if !more {
				break
			}
		}
	}
	return nil
}

// versionMatcher takes, from history rows visited in key order, the record
// of each wanted key into its entry. A wanted key that no row matches is
// left for the point read, which reports it.
type versionMatcher struct {
	es   []*entry
	want [][]byte // es's history keys
	next int      // the first wanted key not passed yet
}

// visit takes row k's record if k is wanted; owned says that v may be
// kept. It reports whether any wanted key is still ahead.
func (m *versionMatcher) visit(k, v []byte, owned bool) (bool, error) {
	for m.next < len(m.want) && bytes.Compare(m.want[m.next], k) < 0 {
		m.next++
	}
	if m.next < len(m.want) && bytes.Equal(m.want[m.next], k) {
		if !owned {
			v = bytes.Clone(v)
		}
		ver, err := decodeVersion(v)
		if err != nil {
			return false, err
		}
		m.es[m.next].ver = &ver
		m.next++
	}
	return m.next < len(m.want), nil
}

// scanVersionsParts bounds the range reads scanVersions issues at once, and
// scanVersionsPerPart is the fewest records one of them reads.
const (
	scanVersionsParts   = 16
	scanVersionsPerPart = 32
)

func compareEntryKeys(a, b *entry) int { return bytes.Compare(a.key, b.key) }
