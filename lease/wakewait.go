package lease

import (
	"context"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// wakeWait is the expiring owner's wait for a change of the wake key,
// on a goroutine of its own. It outlives the quiet sleep that started it:
// when the owner wakes at its bound, reads the index and finds the key
// still holding seen, the next quiet sleep keeps waiting on the same
// wait instead of starting another. On FoundationDB a new wait is a
// transaction (read version, read, watch) and the watch's registration at
// a storage server, which a connected quiet tenant otherwise paid at every
// QuietScanInterval; now it pays the index read alone.
type wakeWait struct {
	seen   []byte
	cancel context.CancelFunc
	done   chan struct{} // closed when the wait ends
	err    error         // set before done closes
}

// startWakeWait waits on db for the wake key to differ from seen, until
// ctx ends or the wait is stopped.
func startWakeWait(ctx context.Context, db storage.DB, seen []byte) *wakeWait {
	ctx, cancel := context.WithCancel(ctx)
	w := &wakeWait{seen: seen, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = db.WaitChange(ctx, wakeKey, seen)
	}()
	return w
}

// ended reports whether the wait is over: the key changed, the wait
// failed, or its context ended (Stop, or stop).
func (w *wakeWait) ended() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// waits reports whether w still waits for a change from seen.
func (w *wakeWait) waits(seen []byte) bool {
	return !w.ended() && storage.SameValue(w.seen, seen)
}

// stop ends the wait and joins its goroutine.
func (w *wakeWait) stop() {
	w.cancel()
	<-w.done
}
