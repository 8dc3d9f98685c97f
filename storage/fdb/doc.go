// Package fdb is the FoundationDB storage backend: every byte of an fdb-etcd
// keyspace lives in a FoundationDB cluster, so any number of fdb-etcd
// processes can serve the same data.
//
// The implementation needs cgo and the FoundationDB 7.3 client library
// (libfdb_c), so it is compiled only with the build tag "fdb"
// (go build -tags fdb). Without the tag this package is empty.
//
// # Key layout
//
// A keyspace is named by a string (the --fdb-prefix flag). All of its keys are
// stored under the tuple-layer encoding of that name,
//
//	KeyPrefix(name) = tuple.Tuple{name}.Pack() = 0x02 name' 0x00
//
// where name' is name with every 0x00 byte escaped as 0x00 0xff. The encoding
// ends with an unescaped 0x00, so no keyspace's prefix is a prefix of another
// one's ("a" and "ab" are disjoint), several keyspaces share one cluster
// safely, and a keyspace is easy to find with FoundationDB's own tools. A
// storage key k of the keyspace is the FoundationDB key KeyPrefix(name) + k.
//
// # Limits
//
// FoundationDB's client refuses keys longer than 10,000 bytes, and the prefix
// would eat into that budget, while the storage contract promises callers
// storage.MaxKeySize bytes of their own. The backend therefore raises the
// client's key_size_limit knob by MaxPrefixBytes (a client-side check only:
// the servers accept keys up to 30,000 bytes) and enforces storage.MaxKeySize
// (plus storage.MaxNestingBytes for a nested keyspace's prefix) on the
// caller's part of the key itself, failing the transaction with
// storage.ErrKeyTooLarge exactly where FoundationDB would (at commit, as a
// deferred error). Values and transaction sizes are left to FoundationDB,
// whose errors 2103 and 2101 map to storage.ErrValueTooLarge and
// storage.ErrTransactionTooLarge.
//
// # Transactions and retries
//
// Update runs the caller's function in a FoundationDB transaction and commits
// it; on an error it asks the transaction's OnError whether and when to retry,
// exactly like the bindings' Transact, but bounded by the context (which
// cancels the transaction) and by Options.MaxRetries. Errors returned by the
// function that mean "retry" in the storage contract (storage.ErrNotCommitted,
// storage.ErrTransactionTooOld, storage.ErrCommitUnknownResult) take the same
// path, with FoundationDB's backoff.
//
// commit_unknown_result (1021) is retried too: the attempt may have committed,
// and the storage contract makes the function responsible for noticing that.
// Every writer above this package does: the revision sequencer writes a batch
// marker in the same transaction and, when a retry finds its own marker,
// rebuilds its answers from the store instead of applying the batch again. So
// a 1021 is never retried blindly; it is retried through that check.
//
// View runs a read-only transaction that is never committed; its reads are
// snapshot reads, which add no conflict ranges (a read-only transaction cannot
// conflict anyway) and still see one consistent read version. Its first
// attempt reads on a transaction that every View of the same read version
// shares (read-your-writes off), waiting for each read on the side so that
// its request's end ends its wait; an attempt that fails with a
// FoundationDB error is retried on a transaction of its own, as Update's
// are (sharedread.go).
//
// Transactions do not implement storage.Scanner on purpose: the bindings copy
// every pair out of the C library anyway, so a scan saves no copying, and
// without a row limit it would have to stream in the iterator mode's small,
// growing batches, where the callers' paged GetRange (want-all with a limit)
// fetches a page in one round trip.
//
// # Read versions
//
// Each attempt first waits for its read version (the reads would wait for
// it anyway). Concurrent transactions share read version requests: those
// that start while no request is being prepared join the next one, sent
// only once they have joined, so its answer is as new as a read version of
// their own (one request is in flight at a time; see versions.go). A View
// whose context asks for storage.Recent reuses, on its first attempt, the
// newest version the DB has read at or committed, if that was the latest
// at most Options.RecentVersionAge (5 ms) before: no round trip at all.
// An Update whose context says storage.Recent does the same within
// Options.WriteVersionAge (100 ms): its commit is checked against
// everything committed since the version it read at, so the reuse risks a
// conflict, never a stale write; an attempt that ends without writes
// commits a write conflict range, so that its reads are checked too.
//
// The backend times each read version request and tells recoveries
// apart: SetObserver installs an Observer that receives every retry with its
// FoundationDB error code, every commit's and every read version's latency,
// and each recovery the client noticed (see versionWatch). The server
// turns these into its fdb_etcd_fdb_* metrics.
//
// # Client fault injection
//
// Options.ClientBuggify turns on FoundationDB's client buggify (network
// options client_buggify_*, set before the network starts): the client
// library then injects retryable errors, commit_unknown_result and delays
// into real transactions against a healthy cluster. It is a testing aid,
// exposed as fdb-etcd's --fdb-client-buggify flags.
//
// WaitChange reads the key, and if it still holds the value the caller has
// seen, sets a FoundationDB watch on it in the same transaction, commits, and
// waits for the watch (or the context, or Close). There is no polling. A
// commit made through the same DB does not wait for the watch: Update
// wakes the DB's WaitChange calls on the keys it wrote once the commit is
// known to have landed (after a commit_unknown_result, only once a retry
// settled it), before it returns; see wake.go.
package fdb
