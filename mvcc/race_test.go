//go:build race

package mvcc_test

// raceBuild: the sequencer checks its invariants in race builds, with
// reads of its own that the round-trip counts include.
const raceBuild = true
