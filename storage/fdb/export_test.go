//go:build fdb

package fdb

// SetCommitHook makes every successful commit of d's Update consult h; an
// error h returns is handled as the commit's result (to inject 1021).
func SetCommitHook(d *DB, h func() error) { d.commitHook = h }

// RegisterWaiter registers on key as a WaitChange call does, without the
// FoundationDB watch: woken reports whether a commit of d has woken it.
func RegisterWaiter(d *DB, key []byte) (woken func() bool, drop func()) {
	fkey := d.key(key)
	w := d.wakes.add(fkey)
	return w.woken, func() { d.wakes.drop(fkey, w) }
}
