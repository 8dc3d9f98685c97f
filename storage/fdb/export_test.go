//go:build fdb

package fdb

import (
	"context"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

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

// ViewFirstAt is View with its first attempt at read version v.
func ViewFirstAt(d *DB, ctx context.Context, v int64, fn func(storage.ReadTx) error) error {
	return d.view(ctx, func() (attemptAt, error) { return attemptAt{v: v}, nil }, fn)
}

// ShareOf identifies the shared transaction a View's tx reads on; nil
// for one of its own.
func ShareOf(t storage.ReadTx) any {
	if s := t.(*tx).share; s != nil {
		return s
	}
	return nil
}

// SetMaxWatches sets the database option max_watches of d's database
// handle, which every DB of its cluster file in the process shares.
func SetMaxWatches(d *DB, n int64) error { return d.db.Options().SetMaxWatches(n) }

// MaxWatches is the limit Open sets.
const MaxWatches = maxWatches
