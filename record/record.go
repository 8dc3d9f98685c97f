// Package record is the encoding of the values fdb-etcd stores under the
// key layout of package keyspace: a key's latest metadata, its versions (the
// history), the revision log and the compaction state. Like the key
// layout, it must not change without a migration: every stored byte
// depends on it. Lease records are package lease's.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/fdb-etcd/fdb-etcd/revision"
)

// Meta is what the latest index keeps per key: enough to count, filter and
// locate a version without reading its value.
type Meta struct {
	ModRev    int64
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
	// Prev, on a tombstone a staged write left, is the live version it
	// deleted: readers of the revisions before the tombstone (every reader
	// while the write is being staged) find the key here instead of in
	// history.
	Prev *Meta
}

const (
	flagTombstone = 1
	flagPrev      = 2
)

// At returns the version of the key live at rev if m tells it without
// history: m itself, or the version a staged tombstone records; nil if m
// says the key was deleted at rev; ok false if only history can tell.
func (m *Meta) At(rev int64) (live *Meta, ok bool) {
	switch {
	case m.ModRev <= rev && m.Tombstone:
		return nil, true
	case m.ModRev <= rev:
		return m, true
	case m.Prev != nil && m.Prev.ModRev <= rev:
		return m.Prev, true
	}
	return nil, false
}

// ErrCorrupt reports a stored value that does not decode.
var ErrCorrupt = errors.New("record: corrupt record")

// EncodeMeta encodes a latest-index entry.
func EncodeMeta(m Meta) []byte {
	out := make([]byte, 1, 1+8*binary.MaxVarintLen64)
	if m.Tombstone {
		out[0] = flagTombstone
	}
	if m.Prev != nil {
		out[0] |= flagPrev
	}
	out = appendMetaFields(out, m)
	if m.Prev != nil {
		out = appendMetaFields(out, *m.Prev)
	}
	return out
}

func appendMetaFields(out []byte, m Meta) []byte {
	out = binary.AppendUvarint(out, uint64(m.ModRev))
	out = binary.AppendUvarint(out, uint64(m.CreateRev))
	out = binary.AppendUvarint(out, uint64(m.Version))
	return binary.AppendVarint(out, m.Lease)
}

// Decoder reads varints and byte strings off b; the first failure sticks.
type Decoder struct {
	b   []byte
	err error
}

// NewDecoder reads b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

// Err is the first failure, nil if none.
func (d *Decoder) Err() error { return d.err }

// Len is the number of bytes left.
func (d *Decoder) Len() int { return len(d.b) }

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrCorrupt
		return 0
	}
	d.b = d.b[n:]
	return int64(v)
}

// Varint reads a signed varint.
func (d *Decoder) Varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = ErrCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = ErrCorrupt
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// Bytes reads n bytes, aliasing the input.
func (d *Decoder) Bytes(n int64) []byte {
	if d.err != nil || n < 0 || int64(len(d.b)) < n {
		d.err = ErrCorrupt
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

// DecodeMeta decodes a latest-index entry.
func DecodeMeta(b []byte) (Meta, error) {
	d := Decoder{b: b}
	flags := d.Byte()
	m := d.metaFields()
	m.Tombstone = flags&flagTombstone != 0
	if flags&flagPrev != 0 {
		prev := d.metaFields()
		m.Prev = &prev
	}
	return m, d.err
}

func (d *Decoder) metaFields() Meta {
	var m Meta
	m.ModRev = d.Uvarint()
	m.CreateRev = d.Uvarint()
	m.Version = d.Uvarint()
	m.Lease = d.Varint()
	return m
}

// Version is one stored version of a key: a history record. Its value is
// split into chunks so that no stored value exceeds FoundationDB's limit.
type Version struct {
	Sub       int64 // position among the revision's changes, as etcd counts them
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
	Chunks    int   // total chunks, the first inline
	ValueLen  int64 // total value length
	First     []byte
}

// ChunkSize keeps every stored value, with its small header, under 100 KB.
const ChunkSize = 96 << 10

// SplitValue splits a value into its inline first chunk and the rest.
func SplitValue(v []byte) (first []byte, rest [][]byte) {
	if len(v) <= ChunkSize {
		return v, nil
	}
	first = v[:ChunkSize]
	for v = v[ChunkSize:]; len(v) > 0; {
		n := min(len(v), ChunkSize)
		rest = append(rest, v[:n])
		v = v[n:]
	}
	return first, rest
}

// EncodeVersion encodes a history record.
func EncodeVersion(r Version) []byte {
	out := make([]byte, 1, 1+6*binary.MaxVarintLen64+len(r.First))
	if r.Tombstone {
		out[0] = flagTombstone
	}
	out = binary.AppendUvarint(out, uint64(r.Sub))
	out = binary.AppendUvarint(out, uint64(r.CreateRev))
	out = binary.AppendUvarint(out, uint64(r.Version))
	out = binary.AppendVarint(out, r.Lease)
	out = binary.AppendUvarint(out, uint64(r.Chunks))
	out = binary.AppendUvarint(out, uint64(r.ValueLen))
	return append(out, r.First...)
}

// DecodeVersion decodes a history record; First aliases b.
func DecodeVersion(b []byte) (Version, error) {
	d := Decoder{b: b}
	r := Version{Tombstone: d.Byte()&flagTombstone != 0}
	r.Sub = d.Uvarint()
	r.CreateRev = d.Uvarint()
	r.Version = d.Uvarint()
	r.Lease = d.Varint()
	r.Chunks = int(d.Uvarint())
	r.ValueLen = d.Uvarint()
	if d.err != nil {
		return Version{}, d.err
	}
	r.First = d.b
	if r.Chunks < 1 || int64(len(r.First)) > r.ValueLen {
		return Version{}, ErrCorrupt
	}
	return r, nil
}

// Meta is the metadata of the version written at modRev.
func (r Version) Meta(modRev int64) Meta {
	return Meta{ModRev: modRev, CreateRev: r.CreateRev, Version: r.Version, Lease: r.Lease, Tombstone: r.Tombstone}
}

// Event types in the revision log; the values match mvccpb.Event_EventType.
const (
	EventPut    = 0
	EventDelete = 1
)

// LogEvent is one change in the revision log. The key's version at the
// event's revision holds the value; PrevRev locates the previous version for
// prev_kv (0 when the key did not exist).
type LogEvent struct {
	Type    byte
	Sub     int64
	PrevRev int64
	Key     []byte
}

// LogEntry is everything one revision changed, and the request that did it.
type LogEntry struct {
	ID     revision.RequestID
	Events []LogEvent
}

// LogPartBytes keeps each stored log part under FoundationDB's value limit.
const LogPartBytes = 90_000

// EncodeLog encodes a revision's log entry in parts.
func EncodeLog(e LogEntry) [][]byte {
	return EncodeLogParts(EncodeLogHeader(e.ID), e.Events)
}

// EncodeLogHeader is the start of a revision's first log part: the request
// that wrote the revision. A staged revision's first part holds only this;
// its events are in the parts after it, written while it was staged.
func EncodeLogHeader(id revision.RequestID) []byte {
	cur := binary.BigEndian.AppendUint64(nil, id.Writer)
	cur = binary.BigEndian.AppendUint64(cur, id.Seq)
	return binary.AppendUvarint(cur, uint64(id.Index))
}

// EncodeLogParts appends events to cur, starting a new part whenever one
// grows past LogPartBytes; an event never spans parts, so each part
// decodes on its own.
func EncodeLogParts(cur []byte, events []LogEvent) [][]byte {
	var parts [][]byte
	for _, ev := range events {
		if len(cur) > LogPartBytes {
			parts = append(parts, cur)
			cur = nil
		}
		cur = append(cur, ev.Type)
		cur = binary.AppendUvarint(cur, uint64(ev.Sub))
		cur = binary.AppendUvarint(cur, uint64(ev.PrevRev))
		cur = binary.AppendUvarint(cur, uint64(len(ev.Key)))
		cur = append(cur, ev.Key...)
	}
	return append(parts, cur)
}

// DecodeLog decodes a revision's log parts, in order.
func DecodeLog(parts [][]byte) (LogEntry, error) {
	var e LogEntry
	for i, p := range parts {
		d := Decoder{b: p}
		if i == 0 {
			if len(p) < 16 {
				return e, ErrCorrupt
			}
			e.ID.Writer = binary.BigEndian.Uint64(p)
			e.ID.Seq = binary.BigEndian.Uint64(p[8:])
			d.b = p[16:]
			e.ID.Index = uint32(d.Uvarint())
		}
		for d.err == nil && len(d.b) > 0 {
			ev := LogEvent{Type: d.Byte()}
			ev.Sub = d.Uvarint()
			ev.PrevRev = d.Uvarint()
			ev.Key = d.Bytes(d.Uvarint())
			e.Events = append(e.Events, ev)
		}
		if d.err != nil {
			return e, fmt.Errorf("log part %d: %w", i, d.err)
		}
	}
	return e, nil
}

// Compaction is the compaction state: the revision requested (reads below it
// fail) and how far physical compaction got: every revision below Finished
// is cleaned up and its log gone, and of revision Finished the log parts
// below Part (partDone: all of them, for the target it was cleaned for).
type Compaction struct {
	Requested int64
	Finished  int64
	Part      uint32
	By        revision.RequestID // the request that set Requested
}

// PartDone marks revision Finished as cleaned up whole.
const PartDone = math.MaxUint32

// EncodeCompaction encodes the compaction state.
func EncodeCompaction(c Compaction) []byte {
	out := binary.BigEndian.AppendUint64(nil, uint64(c.Requested))
	out = binary.BigEndian.AppendUint64(out, uint64(c.Finished))
	out = binary.BigEndian.AppendUint64(out, c.By.Writer)
	out = binary.BigEndian.AppendUint64(out, c.By.Seq)
	out = binary.BigEndian.AppendUint32(out, c.By.Index)
	return binary.BigEndian.AppendUint32(out, c.Part)
}

// DecodeCompaction decodes the compaction state; nil is a store never compacted.
func DecodeCompaction(b []byte) (Compaction, error) {
	if b == nil {
		// etcd starts with compaction revision -1, so Compact(0) succeeds
		// once and revision -1 inside a Txn still reads the current state.
		return Compaction{Requested: -1, Part: PartDone}, nil
	}
	if len(b) != 36 && len(b) != 40 {
		return Compaction{}, ErrCorrupt
	}
	c := Compaction{
		Requested: int64(binary.BigEndian.Uint64(b)),
		Finished:  int64(binary.BigEndian.Uint64(b[8:])),
		Part:      PartDone, // a record without a part cursor finished whole revisions
		By: revision.RequestID{
			Writer: binary.BigEndian.Uint64(b[16:]),
			Seq:    binary.BigEndian.Uint64(b[24:]),
			Index:  binary.BigEndian.Uint32(b[32:]),
		},
	}
	if len(b) == 40 {
		c.Part = binary.BigEndian.Uint32(b[36:])
	}
	return c, nil
}
