//go:build !race

package mvcc

const RaceBuild = false
