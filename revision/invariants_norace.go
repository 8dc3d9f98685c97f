//go:build !race

package revision

const invariants = false
