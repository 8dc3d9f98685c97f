//go:build fdb

package main

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/rawfdb"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// Batches are bounded as fdb-etcd's group commit bounds them by default
// (revision.Config: 1,024 requests, 2 MiB).
const (
	maxBatch      = 1024
	maxBatchBytes = 2 << 20
)

// ringBytes bounds the data one write row leaves in the store: its keys
// cycle through as many as hold that much, and the row clears them when it
// ends. A set of an existing key costs FoundationDB what a set of a new one
// does, but the throwaway `single memory` fdbserver holds 1 GiB (about half
// of it user data), which distinct 2 KB keys at this client's rates fill
// within one row; ratekeeper then stops every commit.
const ringBytes = 128 << 20

// writeOp is one logical operation's writes.
type writeOp struct {
	keys   []fdb.Key
	values [][]byte
	// ifAbsent: set only if keys[0] is absent (a create); created says
	// whether the commit that carried the operation did.
	ifAbsent bool
	created  bool
}

func (o *writeOp) Size() int {
	n := 0
	for i := range o.keys {
		n += len(o.keys[i]) + len(o.values[i])
	}
	return n
}

// commitWrites commits ops in one transaction: the gets of every create
// issued at once, then the sets. Blind sets are idempotent, so a retry after
// commit_unknown_result changes nothing; a create retried so finds its own
// earlier set and counts as not created, which only the row's note shows.
func (c *client) commitWrites(ops []*writeOp) error {
	_, err := c.db.Transact(func(tr fdb.Transaction) (interface{}, error) {
		gets := make([]fdb.FutureByteSlice, len(ops))
		for i, o := range ops {
			if o.ifAbsent {
				gets[i] = tr.Get(o.keys[0])
			}
		}
		for i, o := range ops {
			o.created = true
			if gets[i] != nil {
				v, err := gets[i].Get()
				if err != nil {
					return nil, err
				}
				if v != nil {
					o.created = false
					continue
				}
			}
			for k := range o.keys {
				tr.Set(o.keys[k], o.values[k])
			}
		}
		return nil, nil
	})
	return err
}

// writes runs a write row (RawWrite, RawCreate): one transaction per
// operation, or, batched, the operations of all clients group-committed.
func (c *client) writes(ctx context.Context) (workload.Result, error) {
	s := c.spec
	values := make([][]byte, len(s.Values))
	for i, n := range s.Values {
		values[i] = value(n)
	}
	do := func(o *writeOp) error { return c.commitWrites([]*writeOp{o}) }
	batcher := rawfdb.NewBatcher(maxBatch, maxBatchBytes, c.commitWrites)
	if s.Batched {
		do = batcher.Do
	}
	ring := int64(math.MaxInt64) // creates write the distinct objects LIST reads
	if s.Op == workload.RawWrite {
		ring = max(ringBytes/int64((&writeOp{keys: c.opKeys(0, 0, len(values)), values: values}).Size()), 1)
	}
	var created atomic.Int64
	ops := make([]func(context.Context, int64) error, max(s.Clients, 1))
	for w := range ops {
		// The bindings take no context; the database's transaction timeout
		// bounds each operation instead.
		ops[w] = func(_ context.Context, i int64) error {
			o := &writeOp{keys: c.opKeys(w, i%ring, len(values)), values: values, ifAbsent: s.Op == workload.RawCreate}
			if err := do(o); err != nil {
				return err
			}
			if o.created {
				created.Add(1)
			}
			return nil
		}
	}
	loop := workload.Loop{Bound: s.P.Duration, MaxOps: s.P.MaxOps, OpTimeout: s.P.OpTimeout}
	if s.Op == workload.RawCreate {
		loop.Bound, loop.MaxOps = s.P.TxnTimeCap, int64(s.P.Objects)
	}
	r := loop.Run(ctx, ops)
	if err := r.Err(ctx); err != nil {
		return workload.Result{}, err
	}
	if s.Op == workload.RawWrite {
		if err := c.clearRow(); err != nil {
			return workload.Result{}, fmt.Errorf("clear the row's keys: %w", err)
		}
	}
	res := r.Result()
	res.Note = joinNote(writeNote(s, r, created.Load(), batcher), res.Note)
	if s.Op == workload.RawWrite && !s.PerClientKey && r.Ops > ring {
		res.Note += fmt.Sprintf("; keys cycled through %d (%d MiB)", ring, ringBytes>>20)
	}
	return res, nil
}

// clearRow deletes every key of the row.
func (c *client) clearRow() error {
	_, err := c.db.Transact(func(tr fdb.Transaction) (interface{}, error) {
		tr.ClearRange(fdb.KeyRange{Begin: c.key(""), End: c.key("\xff")})
		return nil, nil
	})
	return err
}

// opKeys are the keys operation i of client w writes: new ones per
// operation, or the client's own on every operation (PerClientKey).
func (c *client) opKeys(w int, i int64, n int) []fdb.Key {
	id := objectID(i)
	if c.spec.PerClientKey {
		id = fmt.Sprintf("client-%04d", w)
	}
	keys := make([]fdb.Key, n)
	for j := range keys {
		if j == 0 {
			keys[j] = c.key(id)
		} else {
			keys[j] = c.key(fmt.Sprintf("%s/%d", id, j))
		}
	}
	return keys
}

// objectID is the key suffix of operation (or object) i.
func objectID(i int64) string { return fmt.Sprintf("%010d", i) }

func writeNote(s workload.RawSpec, r workload.LoadResult, created int64, b *rawfdb.Batcher[*writeOp]) string {
	note := "1 set per operation"
	if len(s.Values) > 1 {
		note = fmt.Sprintf("%d sets per operation", len(s.Values))
	}
	if s.PerClientKey {
		note += ", each client rewriting its own key"
	}
	if s.Op == workload.RawCreate {
		note = fmt.Sprintf("get + set if absent; %d/%d created in %s", created, s.P.Objects, r.Elapsed.Round(time.Millisecond))
	}
	if batches, requests := b.Stats(); batches > 0 {
		note += fmt.Sprintf("; group-committed: %d transactions, %.1f operations each", batches, float64(requests)/float64(batches))
	} else {
		note += "; one transaction per operation"
	}
	return note
}

func joinNote(a, b string) string {
	if b == "" {
		return a
	}
	return a + "; " + b
}
