package owner

import (
	"encoding/binary"
	"errors"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
)

// key holds the one ownership record. It keeps the name it had when it
// named only the lease-expiry owner, so that the epochs of the processes
// that wrote it before continue (a lease's promotion stamp is compared with
// them) and so that such processes, which cannot parse the newer record,
// stop expiring leases once a newer process has written it.
var key = keyspace.Singleton("lease/owner")

// The record's versions: recordVersion's owner rewrites it every renewal;
// processVersion's stands still while its process beats (Process).
const (
	recordVersion  = 2
	processVersion = 3
)

// record is the stored owner:
//
//	version(1) id(8) epoch(8) beat(8) url
//
// ID 0 means vacant (released); the epoch is kept so that the next owner's
// is higher. Beat changes with every renewal, so that observers can tell a
// live owner from a dead one by whether the stored bytes change; with
// Process (version 3) the owner's liveness is instead its process's beat
// key, and the record changes only when ownership does.
type record struct {
	ID      uint64
	Epoch   uint64
	Beat    uint64
	URL     string
	Process bool
}

const recordFixed = 1 + 8 + 8 + 8

// legacyLen is the length of the earlier lease-owner record: id, epoch and
// a held-until time, which changed with every renewal like Beat.
const legacyLen = 24

var errCorrupt = errors.New("owner: corrupt ownership record")

// unreadable stands for the owner of a record that does not decode.
const unreadable = ^uint64(0)

func (r record) encode() []byte {
	out := make([]byte, 1, recordFixed+len(r.URL))
	out[0] = recordVersion
	if r.Process {
		out[0] = processVersion
	}
	out = binary.BigEndian.AppendUint64(out, r.ID)
	out = binary.BigEndian.AppendUint64(out, r.Epoch)
	out = binary.BigEndian.AppendUint64(out, r.Beat)
	return append(out, r.URL...)
}

// decode reads a stored record; nil is vacant.
func decode(b []byte) (record, error) {
	switch {
	case b == nil:
		return record{}, nil
	case len(b) == legacyLen:
		return record{
			ID:    binary.BigEndian.Uint64(b),
			Epoch: binary.BigEndian.Uint64(b[8:]),
			Beat:  binary.BigEndian.Uint64(b[16:]),
		}, nil
	case len(b) >= recordFixed && (b[0] == recordVersion || b[0] == processVersion):
		return record{
			ID:      binary.BigEndian.Uint64(b[1:]),
			Epoch:   binary.BigEndian.Uint64(b[9:]),
			Beat:    binary.BigEndian.Uint64(b[17:]),
			URL:     string(b[recordFixed:]),
			Process: b[0] == processVersion,
		}, nil
	}
	return record{}, errCorrupt
}
