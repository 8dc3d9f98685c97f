//go:build race

package watch

// invariants turns on the sender's self-checks; they are compiled into
// race-enabled builds, which is how the tests run.
const invariants = true
