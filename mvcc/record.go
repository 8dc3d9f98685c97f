package mvcc

import (
	"github.com/fdb-etcd/fdb-etcd/record"
	"github.com/fdb-etcd/fdb-etcd/revision"
)

// The stored records are package record's, next to the key layout; mvcc
// reads and writes them under these short names.
type (
	meta       = record.Meta
	version    = record.Version
	logEvent   = record.LogEvent
	logEntry   = record.LogEntry
	compaction = record.Compaction
)

const (
	chunkSize    = record.ChunkSize
	logPartBytes = record.LogPartBytes
	partDone     = record.PartDone
	evPut        = record.EventPut
	evDelete     = record.EventDelete
)

var errCorrupt = record.ErrCorrupt

func encodeMeta(m meta) []byte                      { return record.EncodeMeta(m) }
func decodeMeta(b []byte) (meta, error)             { return record.DecodeMeta(b) }
func splitValue(v []byte) ([]byte, [][]byte)        { return record.SplitValue(v) }
func encodeVersion(r version) []byte                { return record.EncodeVersion(r) }
func decodeVersion(b []byte) (version, error)       { return record.DecodeVersion(b) }
func encodeLog(e logEntry) [][]byte                 { return record.EncodeLog(e) }
func encodeLogHeader(id revision.RequestID) []byte  { return record.EncodeLogHeader(id) }
func decodeLog(parts [][]byte) (logEntry, error)    { return record.DecodeLog(parts) }
func encodeCompaction(c compaction) []byte          { return record.EncodeCompaction(c) }
func decodeCompaction(b []byte) (compaction, error) { return record.DecodeCompaction(b) }
func encodeLogParts(cur []byte, events []logEvent) [][]byte {
	return record.EncodeLogParts(cur, events)
}
