package mvcc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/fdb-etcd/fdb-etcd/revision"
)

// meta is what the latest index keeps per key: enough to count, filter and
// locate a version without reading its value.
type meta struct {
	ModRev    int64
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
	// Prev, on a tombstone a staged write left, is the live version it
	// deleted: readers of the revisions before the tombstone (every reader
	// while the write is being staged) find the key here instead of in
	// history.
	Prev *meta
}

const (
	flagTombstone = 1
	flagPrev      = 2
)

// at returns the version of the key live at rev if m tells it without
// history: m itself, or the version a staged tombstone records; nil if m
// says the key was deleted at rev; ok false if only history can tell.
func (m *meta) at(rev int64) (live *meta, ok bool) {
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

var errCorrupt = errors.New("mvcc: corrupt record")

func encodeMeta(m meta) []byte {
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

func appendMetaFields(out []byte, m meta) []byte {
	out = binary.AppendUvarint(out, uint64(m.ModRev))
	out = binary.AppendUvarint(out, uint64(m.CreateRev))
	out = binary.AppendUvarint(out, uint64(m.Version))
	return binary.AppendVarint(out, m.Lease)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return int64(v)
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte1() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errCorrupt
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes(n int64) []byte {
	if d.err != nil || n < 0 || int64(len(d.b)) < n {
		d.err = errCorrupt
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func decodeMeta(b []byte) (meta, error) {
	d := decoder{b: b}
	flags := d.byte1()
	m := d.metaFields()
	m.Tombstone = flags&flagTombstone != 0
	if flags&flagPrev != 0 {
		prev := d.metaFields()
		m.Prev = &prev
	}
	return m, d.err
}

func (d *decoder) metaFields() meta {
	var m meta
	m.ModRev = d.uvarint()
	m.CreateRev = d.uvarint()
	m.Version = d.uvarint()
	m.Lease = d.varint()
	return m
}

// version is one stored version of a key: a history record. Its value is
// split into chunks so that no stored value exceeds FoundationDB's limit.
type version struct {
	Sub       int64 // position among the revision's changes, as etcd counts them
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
	Chunks    int   // total chunks, the first inline
	ValueLen  int64 // total value length
	First     []byte
}

// chunkSize keeps every stored value, with its small header, under 100 KB.
const chunkSize = 96 << 10

func splitValue(v []byte) (first []byte, rest [][]byte) {
	if len(v) <= chunkSize {
		return v, nil
	}
	first = v[:chunkSize]
	for v = v[chunkSize:]; len(v) > 0; {
		n := min(len(v), chunkSize)
		rest = append(rest, v[:n])
		v = v[n:]
	}
	return first, rest
}

func encodeVersion(r version) []byte {
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

func decodeVersion(b []byte) (version, error) {
	d := decoder{b: b}
	r := version{Tombstone: d.byte1()&flagTombstone != 0}
	r.Sub = d.uvarint()
	r.CreateRev = d.uvarint()
	r.Version = d.uvarint()
	r.Lease = d.varint()
	r.Chunks = int(d.uvarint())
	r.ValueLen = d.uvarint()
	if d.err != nil {
		return version{}, d.err
	}
	r.First = d.b
	if r.Chunks < 1 || int64(len(r.First)) > r.ValueLen {
		return version{}, errCorrupt
	}
	return r, nil
}

func (r version) meta(modRev int64) meta {
	return meta{ModRev: modRev, CreateRev: r.CreateRev, Version: r.Version, Lease: r.Lease, Tombstone: r.Tombstone}
}

// Event types in the revision log; the values match mvccpb.Event_EventType.
const (
	evPut    = 0
	evDelete = 1
)

// logEvent is one change in the revision log. The key's version at the
// event's revision holds the value; PrevRev locates the previous version for
// prev_kv (0 when the key did not exist).
type logEvent struct {
	Type    byte
	Sub     int64
	PrevRev int64
	Key     []byte
}

// logEntry is everything one revision changed, and the request that did it.
type logEntry struct {
	ID     revision.RequestID
	Events []logEvent
}

// logPartBytes keeps each stored log part under FoundationDB's value limit.
const logPartBytes = 90_000

func encodeLog(e logEntry) [][]byte {
	return encodeLogParts(encodeLogHeader(e.ID), e.Events)
}

// encodeLogHeader is the start of a revision's first log part: the request
// that wrote the revision. A staged revision's first part holds only this;
// its events are in the parts after it, written while it was staged.
func encodeLogHeader(id revision.RequestID) []byte {
	cur := binary.BigEndian.AppendUint64(nil, id.Writer)
	cur = binary.BigEndian.AppendUint64(cur, id.Seq)
	return binary.AppendUvarint(cur, uint64(id.Index))
}

// encodeLogParts appends events to cur, starting a new part whenever one
// grows past logPartBytes; an event never spans parts, so each part
// decodes on its own.
func encodeLogParts(cur []byte, events []logEvent) [][]byte {
	var parts [][]byte
	for _, ev := range events {
		if len(cur) > logPartBytes {
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

func decodeLog(parts [][]byte) (logEntry, error) {
	var e logEntry
	for i, p := range parts {
		d := decoder{b: p}
		if i == 0 {
			if len(p) < 16 {
				return e, errCorrupt
			}
			e.ID.Writer = binary.BigEndian.Uint64(p)
			e.ID.Seq = binary.BigEndian.Uint64(p[8:])
			d.b = p[16:]
			e.ID.Index = uint32(d.uvarint())
		}
		for d.err == nil && len(d.b) > 0 {
			ev := logEvent{Type: d.byte1()}
			ev.Sub = d.uvarint()
			ev.PrevRev = d.uvarint()
			ev.Key = d.bytes(d.uvarint())
			e.Events = append(e.Events, ev)
		}
		if d.err != nil {
			return e, fmt.Errorf("log part %d: %w", i, d.err)
		}
	}
	return e, nil
}

// compaction is the compaction state: the revision requested (reads below it
// fail) and how far physical compaction got: every revision below Finished
// is cleaned up and its log gone, and of revision Finished the log parts
// below Part (partDone: all of them, for the target it was cleaned for).
type compaction struct {
	Requested int64
	Finished  int64
	Part      uint32
	By        revision.RequestID // the request that set Requested
}

// partDone marks revision Finished as cleaned up whole.
const partDone = math.MaxUint32

func encodeCompaction(c compaction) []byte {
	out := binary.BigEndian.AppendUint64(nil, uint64(c.Requested))
	out = binary.BigEndian.AppendUint64(out, uint64(c.Finished))
	out = binary.BigEndian.AppendUint64(out, c.By.Writer)
	out = binary.BigEndian.AppendUint64(out, c.By.Seq)
	out = binary.BigEndian.AppendUint32(out, c.By.Index)
	return binary.BigEndian.AppendUint32(out, c.Part)
}

func decodeCompaction(b []byte) (compaction, error) {
	if b == nil {
		// etcd starts with compaction revision -1, so Compact(0) succeeds
		// once and revision -1 inside a Txn still reads the current state.
		return compaction{Requested: -1, Part: partDone}, nil
	}
	if len(b) != 36 && len(b) != 40 {
		return compaction{}, errCorrupt
	}
	c := compaction{
		Requested: int64(binary.BigEndian.Uint64(b)),
		Finished:  int64(binary.BigEndian.Uint64(b[8:])),
		Part:      partDone, // a record without a part cursor finished whole revisions
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
