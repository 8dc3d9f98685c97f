// Package mvcc is etcd's data model over the storage interface: keys with
// create/mod revisions and versions, a retained history readable at any
// revision since the last compaction, the revision log the watch hub tails,
// and etcd's Range/Put/DeleteRange/Txn/Compact semantics. It is written once
// for every backend and respects FoundationDB's limits even on Pebble: values
// are chunked, long reads are paged across transactions at a fixed revision,
// and write batches are idempotent.
package mvcc

import "errors"

// Domain errors. The server maps each onto etcd's gRPC error in one table.
var (
	ErrCompacted       = errors.New("mvcc: required revision has been compacted")
	ErrFutureRev       = errors.New("mvcc: required revision is a future revision")
	ErrKeyNotFound     = errors.New("mvcc: key not found")
	ErrLeaseNotFound   = errors.New("mvcc: lease not found")
	ErrRequestTooLarge = errors.New("mvcc: request is too large")
	ErrStopped         = errors.New("mvcc: store stopped")
	// ErrTimeout: a write could not be committed in time; it may or may
	// not have been applied (etcd's "request timed out").
	ErrTimeout = errors.New("mvcc: request timed out")
	// ErrYielded: a write gave way to the write owner before it could
	// commit (revision.Config.Yield); it was not applied, and the caller
	// that asked for yielding sends it to the owner.
	ErrYielded = errors.New("mvcc: write yielded to the write owner; not applied")
)
