package mvcc

// RaceBuild says the tests run under the race detector, the builds that
// compile the invariant checks in (invariants_race.go): the sequencer then
// checks its invariants, with reads of its own that the round-trip counts
// include, and the slowest crash tests check a sample of their crash images.
const RaceBuild = invariants
