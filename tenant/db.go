// Package tenant serves many etcd keyspaces from one store: a tenant is a
// whole fdb-etcd keyspace under its own prefix (keyspace.TenantPrefix), so
// it has its own revisions from 1, compaction, leases, alarms and member
// records, and an unmodified server.Server serves it. The registry names
// tenants; the router gives each client certificate's tenant its own
// server, started on the first connection and stopped when idle.
package tenant

import (
	"bytes"
	"context"
	"errors"
	"sync"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// ErrDeleted fails every transaction of a tenant once it is deleted.
var ErrDeleted = errors.New("tenant: deleted")

// exactSizeBelow is the size under which Size counts the tenant's bytes
// itself: the backends' sampled estimates read 0 for small ranges, and
// etcd clients read a zero dbSize as an empty or broken member.
const exactSizeBelow = 4 << 20

// sizePage is how many pairs one View of the exact count reads.
const sizePage = 1000

// DB is one tenant's keyspace inside a shared store: every key is stored
// under the tenant's prefix, and every transaction reads the tenant's live
// marker, so that deleting the tenant fences off transactions still running
// for it (they fail with ErrDeleted instead of writing into a cleared
// prefix). Close releases the tenant's view, never the shared store.
type DB struct {
	inner  storage.DB
	prefix []byte
	end    []byte
	live   []byte // keyspace.TenantLive(id), a key of the shared store
	// quotas are the tenant's quotas as the newest transaction read them
	// from its live marker.
	quotas *quotaCell
	// shared is the process's queue of transactions shared among its
	// tenants (UpdateShared); nil runs each on its own.
	shared *sharedUpdates

	lifeMu   sync.Mutex
	isClosed bool           // guarded by lifeMu
	inflight sync.WaitGroup // calls admitted before Close

	closing   context.Context // canceled by Close: wakes WaitChange
	stopClose context.CancelFunc
}

var (
	_ storage.DB    = (*DB)(nil)
	_ storage.Sizer = (*DB)(nil)
)

// NewDB returns tenant id's keyspace in inner.
func NewDB(inner storage.DB, id uint64) *DB { return newDB(inner, id, Quotas{}, nil) }

// newDB returns tenant id's keyspace, with the quotas its record had when
// its server started, sharing transactions through shared (may be nil).
func newDB(inner storage.DB, id uint64, q Quotas, shared *sharedUpdates) *DB {
	p := keyspace.TenantPrefix(id)
	ctx, cancel := context.WithCancel(context.Background())
	return &DB{inner: inner, prefix: p, end: storage.Strinc(p), live: keyspace.TenantLive(id),
		quotas: newQuotaCell(q), shared: shared, closing: ctx, stopClose: cancel}
}

// Quotas are the tenant's quotas as of the newest transaction that read
// its live marker.
func (d *DB) Quotas() Quotas { return d.quotas.Load() }

func (d *DB) enter() error {
	d.lifeMu.Lock()
	defer d.lifeMu.Unlock()
	if d.isClosed {
		return storage.ErrClosed
	}
	d.inflight.Add(1)
	return nil
}

// Update runs fn in a transaction of the shared store on prefixed keys.
func (d *DB) Update(ctx context.Context, fn func(tx storage.Tx) error) error {
	return d.updateOuter(ctx, func(tx, _ storage.Tx) error { return fn(tx) })
}

// updateOuter is Update whose fn also gets the transaction on the shared
// store's own keys (outer).
func (d *DB) updateOuter(ctx context.Context, fn func(tx, outer storage.Tx) error) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.inflight.Done()
	return d.inner.Update(ctx, func(itx storage.Tx) error {
		t := d.wrap(itx, itx)
		if err := fn(t.(storage.Tx), itx); err != nil {
			return err
		}
		return t.fenceOf().check()
	})
}

// View runs fn on a snapshot of the shared store on prefixed keys.
func (d *DB) View(ctx context.Context, fn func(tx storage.ReadTx) error) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.inflight.Done()
	return d.inner.View(ctx, func(itx storage.ReadTx) error {
		t := d.wrap(itx, nil)
		if err := fn(t); err != nil {
			return err
		}
		return t.fenceOf().check()
	})
}

// WaitChange waits on the prefixed key; Close wakes it with ErrClosed.
func (d *DB) WaitChange(ctx context.Context, key, seen []byte) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.inflight.Done()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.closing, cancel)()
	err := d.inner.WaitChange(wctx, d.key(key), seen)
	if err != nil && d.closing.Err() != nil && ctx.Err() == nil {
		return storage.ErrClosed
	}
	return err
}

// Close waits for calls in flight and wakes blocked WaitChange calls; the
// shared store stays open.
func (d *DB) Close() error {
	d.lifeMu.Lock()
	if d.isClosed {
		d.lifeMu.Unlock()
		return storage.ErrClosed
	}
	d.isClosed = true
	d.lifeMu.Unlock()
	d.stopClose()
	d.inflight.Wait()
	return nil
}

// Size is the tenant's bytes: the backend's estimate of its range, or,
// below exactSizeBelow, the sum of its keys and values.
func (d *DB) Size() (int64, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.inflight.Done()
	var est int64
	if rs, ok := d.inner.(storage.RangeSizer); ok {
		n, err := rs.RangeSize(d.prefix, d.end)
		if err != nil {
			return 0, err
		}
		est = n
	}
	if est >= exactSizeBelow {
		return est, nil
	}
	sum, err := d.countBytes(exactSizeBelow)
	return max(est, sum), err
}

// countBytes sums key and value bytes of the tenant up to limit, a page
// per View so that no read outlives a transaction.
func (d *DB) countBytes(limit int64) (int64, error) {
	var sum int64
	from := d.prefix
	for sum < limit {
		var page []storage.KeyValue
		err := d.inner.View(context.Background(), func(tx storage.ReadTx) error {
			var err error
			page, err = tx.GetRange(from, d.end, storage.RangeOptions{Limit: sizePage})
			return err
		})
		if err != nil {
			return 0, err
		}
		for _, kv := range page {
			sum += int64(len(kv.Key) - len(d.prefix) + len(kv.Value))
		}
		if len(page) < sizePage {
			break
		}
		from = append(bytes.Clone(page[len(page)-1].Key), 0)
	}
	return sum, nil
}

func (d *DB) key(k []byte) []byte {
	out := make([]byte, len(d.prefix)+len(k))
	copy(out, d.prefix)
	copy(out[len(d.prefix):], k)
	return out
}
