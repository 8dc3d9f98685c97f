//go:build fdbetcd_testhooks

package mvcc

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/record"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// The persisted-request journal is a TEST-ONLY storage wrapper, compiled only
// with the fdbetcd_testhooks build tag (the robustness suite's builds). etcd's
// robustness validators need every request the server persisted, in order;
// etcd reads them from its raft WAL. fdb-etcd's equivalent is the revision log
// plus the history versions it names, but compaction removes both, and lease
// grants, empty revokes and compactions take no revision. The journal keeps,
// in the same storage transaction as the writes themselves (so it is exactly
// as durable and atomic as they are, under crashes, retries and
// commit-unknown-result), a copy of every write to the families that describe
// persisted requests:
//
//	history and chunks (values)      0x03, 0x04
//	revision log (events, by rev)    0x05
//	lease records (grants, revokes)  0x07 set / clear
//	compaction state                 0x01 'c'
//
// Copies live under a family no layer reads (keyspace.JournalRecord) and are
// never cleared, so ExportPersisted can rebuild the persisted requests after
// any amount of compaction. It doubles the bytes written; never enable it in
// production.

// journalPartBytes keeps each stored journal part under FoundationDB's value
// limit, so the journal also works over the faulty wrapper's limits.
const journalPartBytes = 90_000

const (
	jopSet   = 1
	jopClear = 2
)

// Journal wraps db so that every committed transaction also records, in the
// same transaction, the writes ExportPersisted needs. Test and debugging use
// only: see the comment above.
func Journal(db storage.DB) storage.DB { return &journalDB{inner: db} }

type journalDB struct{ inner storage.DB }

var (
	_ storage.DB      = (*journalDB)(nil)
	_ storage.Sizer   = (*journalDB)(nil)
	_ storage.Scanner = (*journalTx)(nil)
)

func (j *journalDB) Update(ctx context.Context, fn func(storage.Tx) error) error {
	return j.inner.Update(ctx, func(tx storage.Tx) error {
		jt := &journalTx{Tx: tx}
		if err := fn(jt); err != nil {
			return err
		}
		if len(jt.rec) == 0 {
			return nil
		}
		v, err := tx.Get(keyspace.JournalCounter)
		if err != nil {
			return err
		}
		var n uint64
		if len(v) == 8 {
			n = binary.BigEndian.Uint64(v)
		}
		n++
		for i, rec := uint32(0), jt.rec; len(rec) > 0; i++ {
			p := min(len(rec), journalPartBytes)
			tx.Set(keyspace.JournalRecord(n, i), rec[:p])
			rec = rec[p:]
		}
		tx.Set(keyspace.JournalCounter, binary.BigEndian.AppendUint64(nil, n))
		return nil
	})
}

func (j *journalDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return j.inner.View(ctx, fn)
}

func (j *journalDB) WaitChange(ctx context.Context, key, seen []byte) error {
	return j.inner.WaitChange(ctx, key, seen)
}

func (j *journalDB) Close() error { return j.inner.Close() }

func (j *journalDB) Size() (int64, error) {
	if s, ok := j.inner.(storage.Sizer); ok {
		return s.Size()
	}
	return 0, nil
}

type journalTx struct {
	storage.Tx
	rec []byte
}

func journaled(key []byte) bool {
	switch keyspace.FamilyOf(key) {
	case keyspace.FamilyHistory, keyspace.FamilyChunk, keyspace.FamilyLog, keyspace.FamilyLease:
		return true
	}
	return string(key) == string(keyspace.Compaction)
}

func (t *journalTx) record(op byte, key, value []byte) {
	t.rec = append(t.rec, op)
	t.rec = binary.AppendUvarint(t.rec, uint64(len(key)))
	t.rec = append(t.rec, key...)
	t.rec = binary.AppendUvarint(t.rec, uint64(len(value)))
	t.rec = append(t.rec, value...)
}

func (t *journalTx) Set(key, value []byte) {
	if journaled(key) {
		t.record(jopSet, key, value)
	}
	t.Tx.Set(key, value)
}

func (t *journalTx) Clear(key []byte) {
	if keyspace.FamilyOf(key) == keyspace.FamilyLease {
		t.record(jopClear, key, nil)
	}
	t.Tx.Clear(key)
}

// Scan keeps the inner transaction's zero-copy scan available.
func (t *journalTx) Scan(begin, end []byte, fn func(key, value []byte) bool) error {
	return storage.Scan(t.Tx, begin, end, 0, fn)
}

type journalOp struct {
	op         byte
	key, value []byte
}

// readJournal returns the journal's transactions in commit order, each as
// its recorded operations in the order they were issued.
func readJournal(ctx context.Context, db storage.DB) ([][]journalOp, error) {
	var out [][]journalOp
	var cur []byte
	var curN uint64
	flush := func() error {
		if cur == nil {
			return nil
		}
		ops, err := decodeJournal(cur)
		if err != nil {
			return fmt.Errorf("journal record %d: %w", curN, err)
		}
		out = append(out, ops)
		cur = nil
		return nil
	}
	begin, end := keyspace.JournalAll()
	for {
		var kvs []storage.KeyValue
		err := db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			kvs, err = tx.GetRange(begin, end, storage.RangeOptions{Limit: 1000})
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, kv := range kvs {
			n, part, err := keyspace.ParseJournalRecord(kv.Key)
			if err != nil {
				return nil, fmt.Errorf("journal: key %x: %w", kv.Key, err)
			}
			if part == 0 {
				if err := flush(); err != nil {
					return nil, err
				}
				if n != uint64(len(out))+1 {
					return nil, fmt.Errorf("journal: record %d follows %d", n, len(out))
				}
				curN, cur = n, []byte{}
			} else if n != curN || cur == nil {
				return nil, fmt.Errorf("journal: stray part %d of record %d", part, n)
			}
			cur = append(cur, kv.Value...)
		}
		if len(kvs) < 1000 {
			break
		}
		begin = append(kvs[len(kvs)-1].Key, 0)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

func decodeJournal(b []byte) ([]journalOp, error) {
	var ops []journalOp
	d := record.NewDecoder(b)
	for d.Err() == nil && d.Len() > 0 {
		op := journalOp{op: d.Byte()}
		op.key = d.Bytes(d.Uvarint())
		op.value = d.Bytes(d.Uvarint())
		if d.Err() == nil && op.op != jopSet && op.op != jopClear {
			return nil, record.ErrCorrupt
		}
		ops = append(ops, op)
	}
	return ops, d.Err()
}
