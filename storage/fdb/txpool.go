//go:build fdb

package fdb

import (
	"context"
	"sync"

	fdbgo "github.com/apple/foundationdb/bindings/go/src/fdb"
)

// Transactions are reused. The C client builds a transaction on its one
// network thread and destroys it there too, each a hop between threads
// that costs more CPU than the read a one-key Range sends: a plain client
// doing a read version and one range read per transaction spent 61-73
// µs of CPU per read creating each transaction, and 36-48 µs resetting
// one it kept (16 clients, one memory fdbserver, two cores). A reset
// transaction is the same as a new one — no read version, options,
// reads, writes or cancellation carry over — so a finished call's
// transaction, once reset, serves the next call. The pool is a sync.Pool:
// the transactions it drops are destroyed by the binding's finalizer, as
// unpooled ones always were.
type txPool struct {
	free sync.Pool // of *fdbgo.Transaction, each reset
}

// take returns a reset transaction of db: a pooled one, else a new one.
func (p *txPool) take(db fdbgo.Database) (fdbgo.Transaction, error) {
	if tr, ok := p.free.Get().(*fdbgo.Transaction); ok {
		return *tr, nil
	}
	return db.CreateTransaction()
}

// cancelOn cancels tr when ctx or abort ends, until the returned release
// is called. release resets tr and pools it, unless a cancellation may
// have started: Cancel runs on a goroutine of its own and could then
// cancel tr after its reset, while another call uses it.
func (p *txPool) cancelOn(tr fdbgo.Transaction, ctx, abort context.Context) (release func()) {
	stopCtx := context.AfterFunc(ctx, tr.Cancel)
	stopAbort := context.AfterFunc(abort, tr.Cancel)
	return func() {
		ctxStopped, abortStopped := stopCtx(), stopAbort()
		if ctxStopped && abortStopped {
			p.put(tr)
		}
	}
}

// put resets tr, which no call uses any more and whose cancellation cannot
// start, and pools it.
func (p *txPool) put(tr fdbgo.Transaction) {
	tr.Reset()
	p.free.Put(&tr)
}
