//go:build !race

package watchhub

const invariants = false
