//go:build race

package mvcc

// invariants turns on the read-path self-checks; they are compiled into
// race-enabled builds, which is how the tests run.
const invariants = true
