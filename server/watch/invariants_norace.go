//go:build !race

package watch

const invariants = false
