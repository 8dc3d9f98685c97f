//go:build fdbetcd_testhooks

package mvcc

import (
	"bytes"
	"context"
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// PersistedRequest is one request the server persisted, in the shape etcd's
// robustness model replays (tests/robustness/model.EtcdRequest): every
// revision as a transaction of its puts and deletes, lease grants and
// revokes, and compactions, in the order they committed.
type PersistedRequest struct {
	// Type is "txn", "leaseGrant", "leaseRevoke" or "compact".
	Type string `json:"type"`
	// Revision is the revision the request created (txn, and leaseRevoke
	// when it deleted keys); 0 when it created none.
	Revision int64 `json:"revision,omitempty"`
	// LeaseID names the lease of a leaseGrant or leaseRevoke.
	LeaseID int64 `json:"leaseID,omitempty"`
	// Compact is the revision a compact request compacted to.
	Compact int64 `json:"compact,omitempty"`
	// Ops are a txn's (or a revoke's) changes in etcd's event order.
	Ops []PersistedOp `json:"ops,omitempty"`
}

// PersistedOp is one change of a revision.
type PersistedOp struct {
	Delete bool   `json:"delete,omitempty"`
	Key    []byte `json:"key"`
	Value  []byte `json:"value,omitempty"`
	Lease  int64  `json:"lease,omitempty"`
}

// ExportPersisted rebuilds, from the journal that Journal keeps, every request
// the store persisted, in commit order. It is the fdb-etcd counterpart of
// reading etcd's WAL, for the robustness validators. It checks what it reads:
// revisions must be dense from 2 and never written twice, and every event's
// value must be present. It fails on a store that was not journaled from its
// first write.
func ExportPersisted(ctx context.Context, db storage.DB) ([]PersistedRequest, error) {
	txs, err := readJournal(ctx, db)
	if err != nil {
		return nil, err
	}
	x := exporter{versions: map[string]version{}, chunks: map[string][]byte{}, leases: map[int64]bool{}, staged: map[int64]map[int][]byte{}, lastRev: 1, compacted: -1}
	for i, ops := range txs {
		if err := x.tx(ops); err != nil {
			return nil, fmt.Errorf("journal record %d: %w", i+1, err)
		}
	}
	return x.out, nil
}

type exporter struct {
	versions map[string]version // by history key
	chunks   map[string][]byte  // by chunk key
	leases   map[int64]bool     // granted and not revoked
	// staged holds the log parts of revisions whose first part (written
	// when a staged request is published) has not been seen yet.
	staged    map[int64]map[int][]byte
	lastRev   int64
	compacted int64
	out       []PersistedRequest
}

type exportItem struct {
	kind   string // "rev", "grant", "revoke", "compact"
	rev    int64
	id     int64
	byPart map[int][]byte // a revision's log parts
	parts  [][]byte       // the same, in order, once the transaction is read
}

func (x *exporter) tx(ops []journalOp) error {
	var items []*exportItem
	revs := map[int64]*exportItem{}
	for _, op := range ops {
		k, fam := op.key, keyspace.FamilyOf(op.key)
		switch {
		case op.op == jopSet && fam == keyspace.FamilyHistory:
			v, err := decodeVersion(op.value)
			if err != nil {
				return fmt.Errorf("history %x: %w", k, err)
			}
			v.First = bytes.Clone(v.First)
			x.versions[string(k)] = v
		case op.op == jopSet && fam == keyspace.FamilyChunk:
			x.chunks[string(k)] = op.value
		case op.op == jopSet && fam == keyspace.FamilyLog:
			rev, part, err := keyspace.ParseLog(k)
			if err != nil {
				return err
			}
			if err := x.logPart(revs, &items, rev, part, op.value); err != nil {
				return err
			}
		case op.op == jopSet && fam == keyspace.FamilyLease:
			id, err := keyspace.ParseLease(k)
			if err != nil {
				return err
			}
			if !x.leases[id] {
				x.leases[id] = true
				items = append(items, &exportItem{kind: "grant", id: id})
			}
		case op.op == jopClear && fam == keyspace.FamilyLease:
			id, err := keyspace.ParseLease(k)
			if err != nil {
				return err
			}
			if x.leases[id] {
				delete(x.leases, id)
				items = append(items, &exportItem{kind: "revoke", id: id})
			}
		case op.op == jopSet && bytes.Equal(k, keyspace.Compaction):
			c, err := decodeCompaction(op.value)
			if err != nil {
				return err
			}
			if c.Requested > x.compacted {
				x.compacted = c.Requested
				items = append(items, &exportItem{kind: "compact", rev: c.Requested})
			}
		}
	}
	for _, it := range items {
		if err := it.assemble(); err != nil {
			return err
		}
	}
	for i := 0; i < len(items); i++ {
		it := items[i]
		switch it.kind {
		case "grant":
			x.out = append(x.out, PersistedRequest{Type: "leaseGrant", LeaseID: it.id})
		case "compact":
			x.out = append(x.out, PersistedRequest{Type: "compact", Compact: it.rev})
		case "revoke":
			req := PersistedRequest{Type: "leaseRevoke", LeaseID: it.id}
			// A revoke that deleted keys wrote its revision right after
			// clearing the lease record; no other request in the batch can
			// delete a key the revoked lease held, since it already went.
			if i+1 < len(items) && items[i+1].kind == "rev" {
				events, err := decodeLog(items[i+1].parts)
				if err != nil {
					return fmt.Errorf("revision %d: %w", items[i+1].rev, err)
				}
				if x.revokedBy(events.Events, it.id) {
					r, err := x.revision(items[i+1])
					if err != nil {
						return err
					}
					req.Revision, req.Ops = r.Revision, r.Ops
					i++
				}
			}
			x.out = append(x.out, req)
		case "rev":
			r, err := x.revision(it)
			if err != nil {
				return err
			}
			x.out = append(x.out, r)
		}
	}
	return nil
}

// logPart files one log part: under its revision's item when the
// transaction writes the revision's first part (a batch, or the
// publication of a staged request, which takes the parts staged before),
// and aside otherwise (a staging transaction).
func (x *exporter) logPart(revs map[int64]*exportItem, items *[]*exportItem, rev int64, part int, v []byte) error {
	it := revs[rev]
	switch {
	case part == 0 && it != nil:
		return fmt.Errorf("revision %d logged twice in one transaction", rev)
	case part == 0:
		it = &exportItem{kind: "rev", rev: rev, byPart: x.staged[rev]}
		if it.byPart == nil {
			it.byPart = map[int][]byte{}
		}
		delete(x.staged, rev)
		revs[rev] = it
		*items = append(*items, it)
	case it == nil:
		if rev <= x.lastRev {
			return fmt.Errorf("revision %d: log part %d staged after the revision was published", rev, part)
		}
		if x.staged[rev] == nil {
			x.staged[rev] = map[int][]byte{}
		}
		x.staged[rev][part] = v
		return nil
	}
	if _, dup := it.byPart[part]; dup {
		return fmt.Errorf("revision %d: log part %d written twice", rev, part)
	}
	it.byPart[part] = v
	return nil
}

// assemble orders a revision's parts, which must be 0..n without a gap.
func (it *exportItem) assemble() error {
	if it.kind != "rev" {
		return nil
	}
	it.parts = make([][]byte, len(it.byPart))
	for part, v := range it.byPart {
		if part < 0 || part >= len(it.parts) {
			return fmt.Errorf("revision %d: log parts are not 0..%d", it.rev, len(it.byPart)-1)
		}
		it.parts[part] = v
	}
	return nil
}

// revision turns one logged revision into a txn of its changes, checking
// that revisions stay dense and are never written twice.
func (x *exporter) revision(it *exportItem) (PersistedRequest, error) {
	if it.rev != x.lastRev+1 {
		return PersistedRequest{}, fmt.Errorf("revision %d logged after revision %d: revisions must be dense and never reused", it.rev, x.lastRev)
	}
	x.lastRev = it.rev
	e, err := decodeLog(it.parts)
	if err != nil {
		return PersistedRequest{}, fmt.Errorf("revision %d: %w", it.rev, err)
	}
	if len(e.Events) == 0 {
		return PersistedRequest{}, fmt.Errorf("revision %d: logged with no events", it.rev)
	}
	r := PersistedRequest{Type: "txn", Revision: it.rev}
	for _, ev := range e.Events {
		op := PersistedOp{Key: bytes.Clone(ev.Key), Delete: ev.Type == evDelete}
		if !op.Delete {
			v, ok := x.versions[string(keyspace.History(ev.Key, it.rev))]
			if !ok {
				return r, fmt.Errorf("revision %d: no history for put of %q", it.rev, ev.Key)
			}
			val := bytes.Clone(v.First)
			for c := 1; c < v.Chunks; c++ {
				ch, ok := x.chunks[string(keyspace.Chunk(ev.Key, it.rev, c))]
				if !ok {
					return r, fmt.Errorf("revision %d: chunk %d of %q missing", it.rev, c, ev.Key)
				}
				val = append(val, ch...)
			}
			if int64(len(val)) != v.ValueLen {
				return r, fmt.Errorf("revision %d: value of %q is %d bytes, recorded %d", it.rev, ev.Key, len(val), v.ValueLen)
			}
			op.Value, op.Lease = val, v.Lease
		}
		r.Ops = append(r.Ops, op)
	}
	return r, nil
}

// revokedBy reports whether revision r deleted only keys whose previous
// version was attached to lease id.
func (x *exporter) revokedBy(events []logEvent, id int64) bool {
	for _, ev := range events {
		if ev.Type != evDelete || ev.PrevRev == 0 {
			return false
		}
		prev, ok := x.versions[string(keyspace.History(ev.Key, ev.PrevRev))]
		if !ok || prev.Lease != id {
			return false
		}
	}
	return true
}
