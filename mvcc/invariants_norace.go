//go:build !race

package mvcc

const invariants = false
