// Package keyspace is the on-disk key layout of fdb-etcd, shared by every
// backend. It is the single place that knows how an etcd key and revision
// become a storage key; its golden test pins the encoding, because changing it
// would orphan every stored byte.
//
// Layout (one leading byte per family):
//
//	0x01 'h'                      head: current revision and the batch that wrote it
//	0x01 'c'                      compaction: requested and physically finished revisions
//	0x01 'p'                      pending: the one staged write in progress (reserved revision, request)
//	0x01 'b'                      pending beat: bumped while a staged write makes progress
//	0x01 'r' rev id               read pins: a Range reading across transactions holds compaction at rev
//	0x02 key                      latest: the newest version's metadata of key (or its tombstone)
//	0x03 esc(key) rev             history: one version of key, with the first value chunk
//	0x04 esc(key) rev idx         chunks: value chunks 1.. of one version
//	0x05 rev part                 log: the events of one revision, in parts
//	0x06 lease key                lease attachments: the keys held by a lease
//	0x07 lease                    leases: one record per lease
//	0x08 writer seq               batch markers: what a writer's batch committed
//	0x09 name                     singletons owned by other layers (lease ownership, ...)
//	0x0a id ...                   tenants: each one a whole keyspace of this layout, under its id
//	0x0b 'n' name                 tenant registry: a tenant's record (id, quota)
//	0x0b 'i'                      tenant registry: the last id handed out
//	0x0b 'l' id                   tenant registry: present while tenant id is live
//	0x0c 'b' id                   process beat: bumped by a live process that owns keyspaces of the store
//	0x0c 'd' id                   process deposal mark: rewritten when a keyspace is taken from the process
//	0xfe 'n'                      journal counter: test builds only (mvcc's persisted-request journal)
//	0xfe 'j' n part               journal records: test builds only, never read by the server
//
// A tenant's keyspace (0x0a id) holds families 0x01..0x09 exactly as the
// store holds them without tenancy, so a tenant is an fdb-etcd keyspace of
// its own; families 0x0a, 0x0b and 0x0c never appear inside one.
//
// esc escapes 0x00 as 0x00 0xff and ends with 0x00 0x01, so history keys sort by
// etcd key and then by revision, and no escaped key is a prefix of another.
// Integers are 8-byte big-endian so they sort numerically.
package keyspace

import (
	"bytes"
	"encoding/binary"
	"errors"
)

const (
	famMeta    = 0x01
	famLatest  = 0x02
	famHistory = 0x03
	famChunk   = 0x04
	famLog     = 0x05
	famAttach  = 0x06
	famLease   = 0x07
	famBatch   = 0x08
	famSingle  = 0x09
	famTenant  = 0x0a
	famTenants = 0x0b
	famProcess = 0x0c
	famJournal = 0xfe
)

// Family is a storage key's family: the leading byte that says which record
// a key holds.
type Family byte

// The families a reader outside this package tells apart.
const (
	FamilyHistory Family = famHistory
	FamilyChunk   Family = famChunk
	FamilyLog     Family = famLog
	FamilyLease   Family = famLease
)

// FamilyOf returns k's family; an empty key has none (0).
func FamilyOf(k []byte) Family {
	if len(k) == 0 {
		return 0
	}
	return Family(k[0])
}

// Head is the key every write batch changes; watching it is how readers learn
// of new commits.
var Head = []byte{famMeta, 'h'}

// Compaction holds the compaction state.
var Compaction = []byte{famMeta, 'c'}

// HeadAndCompaction is the key range that holds Head and Compaction and
// nothing else: they sort next to each other, so a reader that needs both
// reads them as one range, one storage request instead of two.
func HeadAndCompaction() (begin, end []byte) {
	return bytes.Clone(Compaction), append(bytes.Clone(Head), 0)
}

// Pending holds the reservation of a write too large for one transaction:
// the revision it takes and the request, staged in several transactions and
// published by one that moves Head. While it exists no other write commits.
var Pending = []byte{famMeta, 'p'}

// PendingBeat is a counter the writer staging the pending write bumps while
// it makes progress; waiters that see it stand still take the write over.
// It is apart from Pending so that the beats never conflict with the
// staging transactions, which read Pending.
var PendingBeat = []byte{famMeta, 'b'}

// ReadPin is the key of read pin id, which holds physical compaction at rev
// while a Range reads across several transactions. Pins sort by revision,
// so the lowest is the first of ReadPins.
func ReadPin(rev int64, id uint64) []byte {
	out := make([]byte, 0, 2+8+8)
	out = append(out, readPins...)
	out = appendU64(out, uint64(rev))
	return appendU64(out, id)
}

var readPins = []byte{famMeta, 'r'}

// ReadPins covers every read pin, lowest revision first.
func ReadPins() ([]byte, []byte) { return bytes.Clone(readPins), []byte{famMeta, 'r' + 1} }

// ParseReadPin returns the revision of a ReadPin key.
func ParseReadPin(k []byte) (int64, error) {
	if len(k) != len(readPins)+16 || !bytes.HasPrefix(k, readPins) {
		return 0, ErrMalformed
	}
	return int64(binary.BigEndian.Uint64(k[len(readPins):])), nil
}

// Singleton names a key owned by a layer above mvcc (lease ownership, ...).
func Singleton(name string) []byte {
	return append([]byte{famSingle}, name...)
}

// Latest is the key of key's newest metadata.
func Latest(key []byte) []byte {
	out := make([]byte, 1+len(key))
	out[0] = famLatest
	copy(out[1:], key)
	return out
}

// LatestRange returns the storage range covering etcd keys [begin, end); an
// empty end means "to the end of the keyspace".
func LatestRange(begin, end []byte) ([]byte, []byte) {
	if len(end) == 0 {
		return Latest(begin), []byte{famLatest + 1}
	}
	return Latest(begin), Latest(end)
}

// LatestKey returns the etcd key of a Latest storage key.
func LatestKey(k []byte) []byte { return k[1:] }

func appendEsc(dst, key []byte) []byte {
	for _, b := range key {
		if b == 0 {
			dst = append(dst, 0, 0xff)
			continue
		}
		dst = append(dst, b)
	}
	return append(dst, 0, 1)
}

func appendU64(dst []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, v)
}

// History is the key of key's version written at rev.
func History(key []byte, rev int64) []byte {
	out := make([]byte, 0, 1+len(key)+2+8+4)
	out = append(out, famHistory)
	out = appendEsc(out, key)
	return appendU64(out, uint64(rev))
}

// HistoryPrefix covers every version of key.
func HistoryPrefix(key []byte) []byte {
	out := make([]byte, 0, 1+len(key)+2+4)
	out = append(out, famHistory)
	return appendEsc(out, key)
}

// HistoryAll covers every history key.
func HistoryAll() ([]byte, []byte) { return []byte{famHistory}, []byte{famHistory + 1} }

// ErrMalformed reports a storage key that is not in this layout.
var ErrMalformed = errors.New("keyspace: malformed key")

// ParseHistory splits a History key into etcd key and revision.
func ParseHistory(k []byte) ([]byte, int64, error) {
	if len(k) < 1+2+8 || k[0] != famHistory {
		return nil, 0, ErrMalformed
	}
	body, revb := k[1:len(k)-8], k[len(k)-8:]
	key := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		if body[i] != 0 {
			key = append(key, body[i])
			continue
		}
		if i+1 >= len(body) {
			return nil, 0, ErrMalformed
		}
		switch body[i+1] {
		case 0xff:
			key = append(key, 0)
			i++
		case 1:
			if i+2 != len(body) {
				return nil, 0, ErrMalformed
			}
			return key, int64(binary.BigEndian.Uint64(revb)), nil
		default:
			return nil, 0, ErrMalformed
		}
	}
	return nil, 0, ErrMalformed
}

// Chunk is the key of value chunk idx (>= 1) of key's version at rev.
func Chunk(key []byte, rev int64, idx int) []byte {
	out := make([]byte, 0, 1+len(key)+2+8+4+4)
	out = append(out, famChunk)
	out = appendEsc(out, key)
	out = appendU64(out, uint64(rev))
	return binary.BigEndian.AppendUint32(out, uint32(idx))
}

// ChunkVersion covers every chunk of key's version at rev.
func ChunkVersion(key []byte, rev int64) ([]byte, []byte) {
	out := make([]byte, 0, 1+len(key)+2+8+4)
	out = append(out, famChunk)
	out = appendEsc(out, key)
	out = appendU64(out, uint64(rev))
	return out, append(bytes.Clone(out), 0xff, 0xff, 0xff, 0xff, 0xff)
}

// Log is the key of part part of revision rev's events.
func Log(rev int64, part int) []byte {
	out := make([]byte, 0, 1+8+4)
	out = append(out, famLog)
	out = appendU64(out, uint64(rev))
	return binary.BigEndian.AppendUint32(out, uint32(part))
}

// LogFrom is the first log key at or after rev.
func LogFrom(rev int64) []byte {
	out := make([]byte, 0, 1+8)
	out = append(out, famLog)
	return appendU64(out, uint64(rev))
}

// ParseLog returns the revision and part of a Log key.
func ParseLog(k []byte) (int64, int, error) {
	if len(k) != 1+8+4 || k[0] != famLog {
		return 0, 0, ErrMalformed
	}
	return int64(binary.BigEndian.Uint64(k[1:9])), int(binary.BigEndian.Uint32(k[9:])), nil
}

// Attach marks key as held by lease.
func Attach(lease int64, key []byte) []byte {
	out := make([]byte, 0, 1+8+len(key))
	out = append(out, famAttach)
	out = appendU64(out, uint64(lease))
	return append(out, key...)
}

// AttachPrefix covers every key held by lease.
func AttachPrefix(lease int64) []byte {
	out := make([]byte, 0, 1+8)
	out = append(out, famAttach)
	return appendU64(out, uint64(lease))
}

// Lease is the key of a lease's record.
func Lease(id int64) []byte {
	out := make([]byte, 0, 1+8)
	out = append(out, famLease)
	return appendU64(out, uint64(id))
}

// LeaseAll covers every lease record.
func LeaseAll() ([]byte, []byte) { return []byte{famLease}, []byte{famLease + 1} }

// ParseLease returns the id of a Lease key.
func ParseLease(k []byte) (int64, error) {
	if len(k) != 9 || k[0] != famLease {
		return 0, ErrMalformed
	}
	return int64(binary.BigEndian.Uint64(k[1:])), nil
}

// BatchAll is the range of every writer's batch markers.
func BatchAll() ([]byte, []byte) { return []byte{famBatch}, []byte{famBatch + 1} }

// Batch is the marker key of a writer's batch.
func Batch(writer uint64, seq uint64) []byte {
	out := make([]byte, 0, 1+16)
	out = append(out, famBatch)
	out = appendU64(out, writer)
	return appendU64(out, seq)
}

// TenantPrefix is the prefix under which tenant id's whole keyspace lives.
func TenantPrefix(id uint64) []byte {
	return appendU64([]byte{famTenant}, id)
}

// TenantRecord is the registry key of the tenant named name.
func TenantRecord(name string) []byte {
	return append([]byte{famTenants, 'n'}, name...)
}

// TenantRecords covers every registry record, in name order.
func TenantRecords() ([]byte, []byte) {
	return []byte{famTenants, 'n'}, []byte{famTenants, 'n' + 1}
}

// TenantName returns the name of a TenantRecord key.
func TenantName(k []byte) (string, error) {
	if len(k) < 2 || k[0] != famTenants || k[1] != 'n' {
		return "", ErrMalformed
	}
	return string(k[2:]), nil
}

// TenantLastID holds the last tenant id handed out; ids are never reused,
// so data a deleted tenant left behind can never surface in a new one.
var TenantLastID = []byte{famTenants, 'i'}

// TenantLive is present exactly while tenant id exists: every transaction
// of the tenant reads it, so deleting it (with the tenant's data, in one
// transaction) fences off every transaction still running for the tenant.
// Its value is the tenant's quotas (package tenant), which running servers
// take from it.
func TenantLive(id uint64) []byte {
	return appendU64([]byte{famTenants, 'l'}, id)
}

// ProcessBeat is bumped by process id while it lives, for the keyspaces
// of the store whose write ownership it holds (package owner): one write
// per process and interval instead of one per keyspace.
func ProcessBeat(id uint64) []byte {
	return appendU64([]byte{famProcess, 'b'}, id)
}

// ProcessDeposed is rewritten by a replica that takes a keyspace's
// ownership from process id, so that the process's next beat learns of it.
func ProcessDeposed(id uint64) []byte {
	return appendU64([]byte{famProcess, 'd'}, id)
}

// JournalCounter holds the number of the last journal record. The journal
// is test machinery (test builds only); the family is declared here so that
// no layer's keys can collide with it.
var JournalCounter = []byte{famJournal, 'n'}

var journalRecords = []byte{famJournal, 'j'}

// JournalRecord is the key of part part of journal record n.
func JournalRecord(n uint64, part uint32) []byte {
	out := make([]byte, 0, len(journalRecords)+8+4)
	out = append(out, journalRecords...)
	out = appendU64(out, n)
	return binary.BigEndian.AppendUint32(out, part)
}

// JournalAll covers every journal record.
func JournalAll() ([]byte, []byte) {
	return bytes.Clone(journalRecords), []byte{famJournal, 'j' + 1}
}

// ParseJournalRecord returns the record number and part of a JournalRecord key.
func ParseJournalRecord(k []byte) (n uint64, part uint32, err error) {
	if len(k) != len(journalRecords)+8+4 || !bytes.HasPrefix(k, journalRecords) {
		return 0, 0, ErrMalformed
	}
	b := k[len(journalRecords):]
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), nil
}
