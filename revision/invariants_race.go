//go:build race

package revision

// invariants turns on the sequencer's self-checks; they are compiled into
// race-enabled builds, which is how the tests run.
const invariants = true
