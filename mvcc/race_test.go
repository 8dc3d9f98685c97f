//go:build race

package mvcc

// RaceBuild says the race detector is on: the sequencer then checks its
// invariants, with reads of its own that the round-trip counts include, and
// the slowest crash tests check a sample of their crash images.
const RaceBuild = true
