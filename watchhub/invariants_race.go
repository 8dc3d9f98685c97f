//go:build race

package watchhub

// invariants turns on the hub's self-checks; they are compiled into
// race-enabled builds, which is how the tests run.
const invariants = true
