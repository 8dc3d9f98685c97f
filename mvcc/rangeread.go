package mvcc

import (
	"bytes"
	"context"
	"errors"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Range reads a range at a revision, paging across read transactions at that
// fixed revision so that no single storage transaction grows with the range.
func (s *Store) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, err := s.rangeRead(ctx, r, true)
	if invariants && err == nil {
		checkRangeHeader(resp)
	}
	return resp, err
}

// RangeChunk is Range without the total count (etcd 3.7's withTotalCount
// false): it stops reading once it has the keys the limit asks for, so a
// streamed range does not re-count the rest of the range for every chunk.
// Count in its response covers only the keys read.
func (s *Store) RangeChunk(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, err := s.rangeRead(ctx, r, false)
	if invariants && err == nil {
		checkRangeHeader(resp)
	}
	return resp, err
}

// rangeRead answers a Range. A Range that needs more than one read
// transaction reads them all at the revision its first fixed, under a read
// pin (readpin.go) that keeps a compaction passing that revision meanwhile
// from removing what the later ones read, as etcd's single read transaction
// is never disturbed. The pin is written once the second transaction is
// needed; if a compaction passed the revision before it was, a Range at
// revision 0 is read again, under that pin, at the newer head — which
// nothing can take away — since etcd never answers a Range at revision 0
// with ErrCompacted; one at an older revision fails with it.
//
// A serializable Range may read a recent snapshot rather than the latest
// (storage.Recent): etcd serves it from one member's state, which may lag
// the cluster's, and on FoundationDB that saves its read version round
// trip. The storage never reads older than what this process already read
// or committed, so a serializable Range does not go back in time.
func (s *Store) rangeRead(ctx context.Context, r *pb.RangeRequest, withCount bool) (*pb.RangeResponse, error) {
	if r.Serializable {
		ctx = storage.WithFreshness(ctx, storage.Recent)
	}
	var pin *readPin
	defer func() { s.unpin(pin) }()
	for {
		if pin != nil && !s.pinLive(pin) {
			s.unpin(pin)
			pin = nil
		}
		resp, held, err := s.rangeAttempt(ctx, r, withCount, pin)
		pin = held
		if r.Revision > 0 || !errors.Is(err, ErrCompacted) || ctx.Err() != nil {
			return resp, err
		}
	}
}

// rangeScan is one attempt's progress through a range, page by page.
type rangeScan struct {
	r         *pb.RangeRequest
	end       []byte // normEnd(r.RangeEnd)
	keep      int    // keepFor(r)
	pageKeys  int
	head, rev int64
	// countable: the count may come from the count cache; cached is the
	// count found there (-1: none), scanCount: the pages must be counted.
	countable bool
	scanCount bool
	// valuesInPage: every kept key is returned (no filter, key order), so
	// each page's transaction reads its keys' values too.
	valuesInPage bool
	cached       int64
	kept         []*entry
	count        int
	cursor       []byte
	// pin holds physical compaction for the scan once it needs a second
	// transaction; pinned: it still may be relied on.
	pin    *readPin
	pinned bool
}

// pageResult is what one read transaction found; it is applied to the scan
// only once the transaction has succeeded, so a retried transaction starts
// from the same state.
type pageResult struct {
	head, rev int64
	cached    int64
	entries   []*entry
	counted   int
	next      []byte
}

// rangeAttempt reads the range once, under pin if one is held already; it
// returns the pin it holds, new or not, for rangeRead to remove.
func (s *Store) rangeAttempt(ctx context.Context, r *pb.RangeRequest, withCount bool, pin *readPin) (*pb.RangeResponse, *readPin, error) {
	q := &rangeScan{r: r, end: normEnd(r.RangeEnd), keep: keepFor(r), pageKeys: s.cfg.PageKeys, cached: -1, scanCount: withCount, cursor: r.Key, pin: pin}
	// A range that returns every key it keeps reads their values in the
	// transaction that finds them, so its pages hold no more keys than
	// one transaction reads values for.
	q.valuesInPage = !r.KeysOnly && !r.CountOnly && keyOrderPrefix(r)
	if q.valuesInPage {
		q.pageKeys = min(q.pageKeys, valuesPerTx)
	}
	// A range whose count the cache knows reads only the keys it returns.
	// Filters and sorting read the whole range anyway.
	q.countable = withCount && q.end != nil && (r.CountOnly || q.keep >= 0)
	for first := true; q.cursor != nil; first = false {
		if !first {
			if err := s.pinScan(ctx, q); err != nil {
				return nil, q.pin, err
			}
		}
		q.pinned = s.pinLive(q.pin)
		var res pageResult
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			res, err = q.readPage(ctx, tx, s.counts, &s.states, first)
			return err
		})
		if err != nil {
			return nil, q.pin, err
		}
		if q.apply(res, first) {
			break
		}
	}
	if q.cached >= 0 {
		q.count = int(q.cached)
	}
	resp, err := buildRange(r, q.kept, q.count, q.head, func(es []*entry) error { return s.resolvePaged(ctx, q, es) })
	if err == nil && withCount && q.end != nil {
		s.leaveCounts(r, q.rev, resp)
	}
	return resp, q.pin, err
}

// pinScan makes sure a scan about to read another transaction holds a pin
// that keeps what it reads. A pin written after a compaction passed the
// scan's revision cannot, and ends the attempt with ErrCompacted.
func (s *Store) pinScan(ctx context.Context, q *rangeScan) error {
	if s.pinLive(q.pin) {
		return nil
	}
	s.unpin(q.pin)
	q.pin = nil
	p, err := s.pinReads(ctx)
	if err != nil {
		return err
	}
	q.pin = p
	if p.floor > q.rev {
		return ErrCompacted
	}
	return nil
}

// apply takes a page's result into the scan and reports whether the scan is
// done before the range is.
func (q *rangeScan) apply(res pageResult, first bool) bool {
	if first {
		q.head, q.rev, q.cached = res.head, res.rev, res.cached
		q.scanCount = q.scanCount && q.cached < 0
	}
	q.kept = append(q.kept, res.entries...)
	q.count += res.counted
	q.cursor = res.next
	return !q.scanCount && (q.r.CountOnly || q.keep >= 0 && len(q.kept) >= q.keep)
}

// readPage reads the scan's next page in tx; the first page also fixes the
// revision and consults the count cache.
func (q *rangeScan) readPage(ctx context.Context, tx storage.ReadTx, counts *countCache, states *stateShare, first bool) (pageResult, error) {
	r := q.r
	res := pageResult{head: q.head, rev: q.rev, cached: q.cached}
	want := q.firstReads(first, scansInPlace(tx))
	f, err := readFirst(ctx, tx, want, states)
	if err != nil {
		return res, err
	}
	h, c := f.head, f.comp
	if first {
		res.head, res.rev = h.Rev, r.Revision
		switch {
		case res.rev > res.head:
			return res, ErrFutureRev
		case res.rev <= 0:
			res.rev = res.head
		}
	}
	if res.rev < c.Requested && !(q.pinned && res.rev >= q.pin.floor) {
		return res, ErrCompacted
	}
	scanCount := q.scanCount
	if first && q.countable {
		n, ok, err := counts.countAt(tx, r.Key, r.RangeEnd, res.rev, c)
		if err != nil {
			return res, err
		}
		if ok {
			res.cached = n
		}
		scanCount = !ok
	}
	if r.CountOnly && !scanCount {
		return res, nil
	}
	var pre *prefetched
	if want.index != nil {
		pre = &prefetched{rows: f.index, complete: len(f.index) < want.index.Opt.Limit}
	}
	if err := q.collect(tx, &res, scanCount, f.key, pre); err != nil {
		return res, err
	}
	if q.valuesHere(first, res) {
		return res, resolveValues(tx, res.entries)
	}
	return res, nil
}

// scansInPlace reports whether tx visits a range where it lies
// (storage.Scanner: the embedded store), with no round trip to save.
func scansInPlace(tx storage.ReadTx) bool {
	_, ok := tx.(storage.Scanner)
	return ok
}

// valuesHere reports whether a page's transaction reads the values of the
// keys it found: a second transaction would cost a read version and the
// compaction check again. Every page of a range that returns all it keeps
// does (a LIST, a page of one); so does a small range read whole in its
// first page (a single-key GET is most of what kube-apiserver reads from
// storage), where a few values that the sort and limit then drop are the
// price.
func (q *rangeScan) valuesHere(first bool, res pageResult) bool {
	switch {
	case q.r.KeysOnly || q.r.CountOnly || len(res.entries) == 0:
		return false
	case q.valuesInPage:
		return true
	default:
		return first && res.next == nil && len(res.entries) <= inlineValues
	}
}

// firstReads is what a page reads with the state: a single key's latest
// entry (at the head, its newest version too, usually the one it returns),
// or a range page's first index entries — as many as the page keeps, which
// is all a limited range with a cached count reads. Every page of a range
// reads them, at the head or not: the live keys at any revision are found
// through the index (scanLive), so they are never read in vain, and a
// paginated LIST's later pages, which name their revision, and a long
// range's later transactions each save a round trip. A store that scans in
// place (inPlace) has no round trip to save, and would copy the entries it
// now visits where they lie, so it reads them in the scan.
func (q *rangeScan) firstReads(first, inPlace bool) firstReads {
	r := q.r
	switch {
	case q.end == nil:
		return firstReads{key: r.Key, atHead: r.Revision <= 0 && !r.CountOnly && !r.KeysOnly}
	case inPlace || r.CountOnly || len(q.end) > 0 && bytes.Compare(q.cursor, q.end) >= 0:
		return firstReads{}
	}
	// A later page that counts the range scans a whole page anyway; the
	// first may find its count in the cache.
	limit := q.pageKeys
	if q.keep >= 0 && (first || !q.scanCount) {
		limit = min(limit, q.keep-len(q.kept))
	}
	if limit <= 0 {
		return firstReads{}
	}
	b, e := keyspace.LatestRange(q.cursor, q.end)
	return firstReads{index: &storage.RangeRead{Begin: b, End: e, Opt: storage.RangeOptions{Limit: limit}}}
}

// collect reads the live keys of one page at res.rev into res; key is what
// the state's round trip read of the key when the range is a single key,
// pre the index entries it read when the page is a range's first.
func (q *rangeScan) collect(tx storage.ReadTx, res *pageResult, scanCount bool, key keyAtHead, pre *prefetched) error {
	want := func() bool { return q.keep < 0 || len(q.kept)+len(res.entries) < q.keep }
	visit := func(key []byte, m meta, ver *version) bool {
		res.counted++
		if want() {
			res.entries = append(res.entries, &entry{key: bytes.Clone(key), meta: m, ver: ver})
		}
		return scanCount || want()
	}
	if q.end == nil {
		e, err := key.entry(tx, q.r.Key, res.rev)
		if e != nil {
			visit(e.key, e.meta, e.ver)
		}
		return err
	}
	if len(q.end) > 0 && bytes.Compare(q.cursor, q.end) >= 0 {
		return nil
	}
	next, err := scanLive(tx, q.cursor, q.end, res.rev, q.pageKeys, pre, visit)
	res.next = next
	return err
}

// leaveCounts records the counts a counted range learned: its own, and after
// a limited page the rest of the range, which the next page will ask for.
func (s *Store) leaveCounts(r *pb.RangeRequest, rev int64, resp *pb.RangeResponse) {
	s.counts.put(r.Key, r.RangeEnd, rev, resp.Count)
	if resp.More && len(resp.Kvs) > 0 && !r.CountOnly && keyOrderPrefix(r) {
		last := resp.Kvs[len(resp.Kvs)-1].Key
		s.counts.put(append(bytes.Clone(last), 0), r.RangeEnd, rev, resp.Count-int64(len(resp.Kvs)))
	}
}

// keyOrderPrefix reports whether a limited Range returns the first live keys
// of its range in key order, so that the rest of the range, after its last
// key, holds exactly Count minus the keys returned. A sort by another target
// or descending, or a revision filter, returns other keys.
func keyOrderPrefix(r *pb.RangeRequest) bool {
	return r.SortTarget == pb.RangeRequest_KEY &&
		(r.SortOrder == pb.RangeRequest_NONE || r.SortOrder == pb.RangeRequest_ASCEND) &&
		r.MinModRevision == 0 && r.MaxModRevision == 0 &&
		r.MinCreateRevision == 0 && r.MaxCreateRevision == 0
}

// inlineValues is the most entries whose values a range resolves in the
// transaction that found them.
const inlineValues = 16

// valuesPerTx bounds the values one read transaction reads.
const valuesPerTx = 2_000

// resolvePaged reads values in bounded read transactions, under the scan's
// read pin, failing if a compaction past the scan's revision could have
// removed them meanwhile.
func (s *Store) resolvePaged(ctx context.Context, q *rangeScan, es []*entry) error {
	const perTx = valuesPerTx
	if !slices.ContainsFunc(es, func(e *entry) bool { return !e.has }) {
		return nil // resolved in the transaction that found them
	}
	for len(es) > 0 {
		n := min(len(es), perTx)
		if err := s.pinScan(ctx, q); err != nil {
			return err
		}
		pinned := s.pinLive(q.pin) && q.rev >= q.pin.floor
		err := s.db.View(ctx, func(tx storage.ReadTx) error {
			_, c, err := readState(tx)
			if err != nil {
				return err
			}
			if q.rev < c.Requested && !pinned {
				return ErrCompacted
			}
			return resolveValues(tx, es[:n])
		})
		if err != nil {
			return err
		}
		es = es[n:]
	}
	return nil
}
