package workload

// RawOp names what the plain FoundationDB client (cmd/fdb-raw, the fdb-raw
// columns) does for a row: the least FoundationDB work the row's logical
// operation needs.
type RawOp string

const (
	// RawWrite is one transaction of blind sets, one per RawSpec.Values
	// entry, each to its own key.
	RawWrite RawOp = "write"
	// RawCreate is a create-if-absent: a get of the key, then a set if it is
	// absent, in one transaction.
	RawCreate RawOp = "create"
	// RawGet is a fresh read version and one get (a linearizable read).
	RawGet RawOp = "get"
	// RawGetRecent is one get at a recently obtained read version (a
	// serializable read, which may reuse one).
	RawGetRecent RawOp = "get-recent"
	// RawList reads the object set in transactions of about a megabyte, all
	// at the first one's read version.
	RawList RawOp = "list"
	// RawListPages reads it in transactions of RawSpec.Page keys, one per
	// page, all at the first page's read version.
	RawListPages RawOp = "list-pages"
	// RawCount counts the object set. FoundationDB has no count and no
	// keys-only range read, so it reads the pairs as RawList does.
	RawCount RawOp = "count"
	// RawWatch measures the delivery of writes through one FoundationDB watch.
	RawWatch RawOp = "watch"
)

// RawSpec is one row's work for the plain FoundationDB client. The harness
// passes it to cmd/fdb-raw as JSON.
type RawSpec struct {
	Op RawOp `json:"op,omitempty"`
	// None, when Op is empty, says why the row has no plain-FoundationDB
	// equivalent.
	None string `json:"none,omitempty"`
	// Batchable marks write rows, whose concurrent operations fdb-raw-batched
	// groups into one transaction as group commit does; Batched asks for it.
	Batchable bool `json:"batchable,omitempty"`
	Batched   bool `json:"batched,omitempty"`
	Clients   int  `json:"clients,omitempty"`
	// Prefix begins every key of the row (for the one-key reads it is the
	// key); the client puts it under its keyspace prefix.
	Prefix string `json:"prefix"`
	// Values are the sizes of the values one operation writes (RawWrite), of
	// the key read (RawGet, RawGetRecent), or of each object.
	Values []int `json:"values,omitempty"`
	// PerClientKey: each client rewrites its own keys on every operation
	// instead of writing new ones (a lease's deadline).
	PerClientKey bool `json:"per_client_key,omitempty"`
	// Page is the page size of RawListPages.
	Page int `json:"page,omitempty"`
	// Rate is the writes per second of RawWatch; Watchers is the etcd row's
	// watcher count, for the note.
	Rate     int `json:"rate,omitempty"`
	Watchers int `json:"watchers,omitempty"`
	// P sizes the run as it sizes the harness's workloads.
	P Params `json:"params"`
}

// RawEquivalent is implemented by every workload: Raw says what fdb-raw does
// for the row (or, with None, why nothing).
type RawEquivalent interface {
	Raw(p Params) RawSpec
}
