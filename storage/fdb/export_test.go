//go:build fdb

package fdb

// SetCommitHook makes every successful commit of d's Update consult h; an
// error h returns is handled as the commit's result (to inject 1021).
func SetCommitHook(d *DB, h func() error) { d.commitHook = h }
