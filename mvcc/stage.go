package mvcc

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/revision"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// A DeleteRange or lease revoke that would write more than Config.StageBytes
// is staged (revision/staged.go): its tombstones are written at the
// reserved revision in transactions of at most StageChunkBytes, by
// StageWorkers at a time, while readers keep reading the revision before it
// (an index entry newer than the read revision is read from history); one
// small transaction then publishes the revision. What the staging writes is
// a function of the store at the reserved base alone, which nothing can
// change while the reservation is pending, so writing it again — after
// commit_unknown_result, or by another process finishing an abandoned
// reservation — writes the same bytes.
//
// A staged revision's first log part holds only the request id and is
// written by the publishing transaction; its events are in parts 1.., each
// staging transaction writing the parts of its own keys. Readers of the
// log see them all at once, when the head reaches the revision.

// Kinds of staged request, the first byte of a reservation's request.
const (
	stagedDelete = 1
	stagedRevoke = 2
)

// maxReservedRequest keeps a reservation's record under FoundationDB's
// value limit.
const maxReservedRequest = 90_000

// deleteCost estimates the bytes deleting key writes: its index entry (with
// the version it deletes, when staged), its tombstone version, its log
// event.
func deleteCost(key []byte) int { return 3*len(key) + 64 }

// stageKeys is the most keys a request deletes without being staged.
func (s *Store) stageKeys() int { return s.cfg.StageBytes / deleteCost(nil) }

// overStageBytes reports whether deleting the keys of attachment entries
// kvs (prefixLen bytes of prefix before each key) must be staged.
func (s *Store) overStageBytes(kvs []storage.KeyValue, prefixLen int) bool {
	if len(kvs) > s.stageKeys() {
		return true
	}
	n := 0
	for _, kv := range kvs {
		n += deleteCost(kv.Key[prefixLen:])
	}
	return n > s.cfg.StageBytes
}

// deleteOversized reports whether a DeleteRange of [key, end) at rev
// deletes more than StageBytes, reading the index only as far as it takes
// to tell (index entries of deleted keys count for their reading, not for
// the delete).
func (s *Store) deleteOversized(tx storage.ReadTx, key, end []byte, rev int64) (bool, error) {
	n, read := 0, 0
	for cursor := key; cursor != nil && (len(end) == 0 || bytes.Compare(cursor, end) < 0); {
		next, err := scanLive(tx, cursor, end, rev, stagePageKeys, nil, func(k []byte, _ meta, _ *version) bool {
			n += deleteCost(k)
			return n <= s.cfg.StageBytes
		})
		if err != nil || n > s.cfg.StageBytes {
			return n > s.cfg.StageBytes, err
		}
		if read += stagePageKeys; read > 16*s.stageKeys() {
			return true, nil // too many to tell in one transaction: stage it
		}
		cursor = next
	}
	return false, nil
}

// staged is a reserved request decoded.
type staged struct {
	del   *pb.DeleteRangeRequest // stagedDelete
	lease int64                  // stagedRevoke
}

func decodeStaged(b []byte) (staged, error) {
	switch {
	case len(b) > 0 && b[0] == stagedDelete:
		r := &pb.DeleteRangeRequest{}
		return staged{del: r}, proto.Unmarshal(b[1:], r)
	case len(b) == 9 && b[0] == stagedRevoke:
		return staged{lease: int64(binary.BigEndian.Uint64(b[1:]))}, nil
	}
	return staged{}, fmt.Errorf("mvcc: staged request %x: %w", b[:min(len(b), 9)], errCorrupt)
}

// stage is the Stager's Stage: it reads the keys to delete at r.Base in
// pages, in key order, and hands each page to the writers.
func (s *Store) stage(ctx context.Context, r revision.Reservation, respond bool) (writeResponse, bool, error) {
	req, err := decodeStaged(r.Req)
	if err != nil {
		return nil, false, err
	}
	var src pageSource = &revokePages{s: s, base: r.Base, id: req.lease, cursor: keyspace.AttachPrefix(req.lease)}
	withValues := false
	if req.del != nil {
		withValues = respond && req.del.PrevKv
		src = &deletePages{s: s, base: r.Base, cursor: req.del.Key, end: normEnd(req.del.RangeEnd), values: withValues}
	}
	w := newStageWriter(ctx, s, r, req.del == nil)
	var prevKvs []*mvccpb.KeyValue
	for !w.failed() {
		page, err := src.next(ctx)
		if err != nil {
			w.abort(err)
			break
		}
		if page == nil {
			break
		}
		if withValues {
			for _, e := range page {
				prevKvs = append(prevKvs, e.kv(true))
			}
		}
		w.submit(page)
	}
	total, err := w.wait()
	if err != nil {
		return nil, false, err
	}
	rev := r.Base
	if total > 0 {
		rev++
	}
	if req.del != nil {
		return &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: rev}, Deleted: total, PrevKvs: prevKvs}, total > 0, nil
	}
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, total > 0, nil
}

// publish is the Stager's Publish: the revision's first log part, and for a
// revoke the lease record and its attachments.
func (s *Store) publish(tx storage.Tx, r revision.Reservation, wrote bool) error {
	req, err := decodeStaged(r.Req)
	if err != nil {
		return err
	}
	if req.del == nil {
		prefix := keyspace.AttachPrefix(req.lease)
		tx.Clear(keyspace.Lease(req.lease))
		tx.ClearRange(prefix, storage.Strinc(prefix))
	}
	if wrote {
		tx.Set(keyspace.Log(r.Base+1, 0), encodeLogHeader(r.ID))
	}
	return nil
}

// pageSource yields the entries a staged request deletes, live at its base,
// in key order, a page at a time; nil after the last.
type pageSource interface {
	next(ctx context.Context) ([]*entry, error)
}

// deletePages pages the live keys of [cursor, end).
type deletePages struct {
	s      *Store
	base   int64
	cursor []byte // nil once done
	end    []byte
	values bool // resolve values, for prev_kv
}

func (d *deletePages) next(ctx context.Context) ([]*entry, error) {
	// A page can hold index entries none of which was live: read on.
	for d.cursor != nil && (len(d.end) == 0 || bytes.Compare(d.cursor, d.end) < 0) {
		page, err := d.read(ctx)
		if err != nil || len(page) > 0 {
			return page, err
		}
	}
	return nil, nil
}

// read reads the next page from cursor and moves the cursor past it.
func (d *deletePages) read(ctx context.Context) ([]*entry, error) {
	var page []*entry
	var next []byte
	err := d.s.view(ctx, func(tx storage.ReadTx) error {
		page, next = nil, nil
		n := 0
		more, err := scanLive(tx, d.cursor, d.end, d.base, stagePageKeys, nil, func(k []byte, m meta, ver *version) bool {
			page = append(page, &entry{key: bytes.Clone(k), meta: m, ver: ver})
			n += deleteCost(k)
			return n < d.s.cfg.StageChunkBytes
		})
		if err != nil {
			return err
		}
		next = more
		if n >= d.s.cfg.StageChunkBytes {
			next = append(bytes.Clone(page[len(page)-1].key), 0)
		}
		if d.values {
			return resolveValues(tx, page)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.cursor = next
	return page, nil
}

// view runs one read of a staging step under its own deadline: staging runs
// under no deadline as a whole (its length grows with the request), but no
// step of it may retry for longer than a batch may.
func (s *Store) view(ctx context.Context, fn func(tx storage.ReadTx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Sequencer.CommitTimeout)
	defer cancel()
	return s.db.View(ctx, fn)
}

// stagePageKeys bounds the index entries one staging read scans.
const stagePageKeys = 4096

// revokePages pages the keys a lease holds, through its attachments.
type revokePages struct {
	s      *Store
	base   int64
	id     int64
	cursor []byte // nil once done
}

func (p *revokePages) next(ctx context.Context) ([]*entry, error) {
	prefix := keyspace.AttachPrefix(p.id)
	for p.cursor != nil {
		var page []*entry
		var next []byte
		err := p.s.view(ctx, func(tx storage.ReadTx) error {
			page, next = nil, nil
			kvs, err := tx.GetRange(p.cursor, storage.Strinc(prefix), storage.RangeOptions{Limit: stageRevokePage})
			if err != nil {
				return err
			}
			n := 0
			for i, kv := range kvs {
				if n += deleteCost(kv.Key[len(prefix):]); n >= p.s.cfg.StageChunkBytes || i == stageRevokePage-1 {
					kvs, next = kvs[:i+1], append(bytes.Clone(kv.Key), 0)
					break
				}
			}
			page, err = leaseKeysAt(tx, kvs, p.id, p.base)
			return err
		})
		if err != nil {
			return nil, err
		}
		p.cursor = next
		if len(page) > 0 {
			return page, nil
		}
	}
	return nil, nil
}

// stageRevokePage bounds the attachments one staging read of a revoke
// reads: each costs a point read of its index entry, batched.
const stageRevokePage = 1024
