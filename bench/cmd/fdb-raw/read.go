//go:build fdb

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/apple/foundationdb/bindings/go/src/fdb"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/rawfdb"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// recentVersionAge is how long a serializable get reuses a read version:
// short next to FoundationDB's 5 s window, long enough that at the row's
// rates nearly every get skips the read version round trip.
const recentVersionAge = 100 * time.Millisecond

// gets runs a one-key read row: a fresh read version and a get per
// operation (RawGet), or a get at a recent read version (RawGetRecent).
func (c *client) gets(ctx context.Context) (workload.Result, error) {
	s := c.spec
	key := c.key("")
	if _, err := c.db.Transact(func(tr fdb.Transaction) (interface{}, error) {
		tr.Set(key, value(s.Values[0]))
		return nil, nil
	}); err != nil {
		return workload.Result{}, fmt.Errorf("write the key: %w", err)
	}
	recent := rawfdb.NewRecentVersion(c.readVersion, recentVersionAge, time.Now)
	get := func() ([]byte, error) {
		v, err := c.db.ReadTransact(func(rt fdb.ReadTransaction) (interface{}, error) {
			return rt.Get(key).Get()
		})
		b, _ := v.([]byte)
		return b, err
	}
	if s.Op == workload.RawGetRecent {
		get = func() ([]byte, error) { return c.getAt(recent, key) }
	}
	ops := make([]func(context.Context, int64) error, max(s.Clients, 1))
	for w := range ops {
		ops[w] = func(context.Context, int64) error {
			v, err := get()
			if err == nil && v == nil {
				err = errors.New("the key is missing")
			}
			return err
		}
	}
	r := workload.Loop{Bound: s.P.Duration, MaxOps: s.P.MaxOps, OpTimeout: s.P.OpTimeout}.Run(ctx, ops)
	if err := r.Err(ctx); err != nil {
		return workload.Result{}, err
	}
	res := r.Result()
	note := "a fresh read version and one get per operation"
	if s.Op == workload.RawGetRecent {
		note = fmt.Sprintf("one get per operation at a read version up to %s old (%d read versions obtained)", recentVersionAge, recent.Fetches())
	}
	res.Note = joinNote(note, res.Note)
	return res, nil
}

// readVersion obtains a fresh read version.
func (c *client) readVersion() (int64, error) {
	tr, err := c.db.CreateTransaction()
	if err != nil {
		return 0, err
	}
	return tr.GetReadVersion().Get()
}

// getAt reads key at a recent read version. It does not retry: at an age
// far inside FoundationDB's window an error is a real one, and the run
// counts it.
func (c *client) getAt(recent *rawfdb.RecentVersion, key fdb.Key) ([]byte, error) {
	rv, err := recent.Get()
	if err != nil {
		return nil, err
	}
	tr, err := c.db.CreateTransaction()
	if err != nil {
		return nil, err
	}
	tr.SetReadVersion(rv)
	return tr.Snapshot().Get(key).Get()
}

// listTxBytes bounds the values one transaction of an unpaginated read
// returns, the size FoundationDB advises keeping a transaction under.
const listTxBytes = 1 << 20

// list times reads of the object set (RawList, RawListPages, RawCount) as
// the harness times its LIST rows: the median of P.ListRuns runs.
func (c *client) list(ctx context.Context) (workload.Result, error) {
	s := c.spec
	want := int64(s.P.Objects)
	perTx := max(listTxBytes/max(s.Values[0], 1), 1)
	if s.Op == workload.RawListPages {
		perTx = max(s.Page, 1)
	}
	if err := c.ensureObjects(ctx, perTx); err != nil {
		return workload.Result{}, fmt.Errorf("preload: %w", err)
	}
	var times []time.Duration
	var txs int
	capAt := time.Now().Add(5 * time.Minute)
	for run := 0; run < s.P.ListRuns && time.Now().Before(capAt); run++ {
		t0 := time.Now()
		n, t, err := c.readRange(ctx, perTx)
		if err != nil {
			return workload.Result{}, err
		}
		if int64(n) < want {
			return workload.Result{}, fmt.Errorf("read %d pairs, want at least %d", n, want)
		}
		times = append(times, time.Since(t0))
		txs = t
	}
	if len(times) == 0 {
		return workload.Result{}, errors.New("no read completed")
	}
	res := workload.TimedRuns(times, want)
	how := "a range read of the pairs"
	if s.Op == workload.RawCount {
		how = "a range read of the pairs, counted (FoundationDB has no count and no keys-only read)"
	}
	res.Note = fmt.Sprintf("%s in %d transactions of up to %d pairs at one read version; %s", how, txs, perTx, res.Note)
	return res, nil
}

// readRange reads the row's whole range in transactions of at most perTx
// pairs: the first at a fresh read version, the others at the same one, so
// the read sees one snapshot as a LIST at one revision does. It returns the
// pairs and transactions read. A read that outlives FoundationDB's 5 s
// window fails (transaction_too_old); nothing older can be read.
func (c *client) readRange(ctx context.Context, perTx int) (n, txs int, err error) {
	begin, end := c.key(""), c.key("\xff")
	var rv int64
	for ctx.Err() == nil {
		tr, err := c.db.CreateTransaction()
		if err != nil {
			return n, txs, err
		}
		if rv != 0 {
			tr.SetReadVersion(rv)
		}
		kvs, err := tr.Snapshot().GetRange(fdb.KeyRange{Begin: begin, End: end},
			fdb.RangeOptions{Limit: perTx, Mode: fdb.StreamingModeWantAll}).GetSliceWithError()
		if err != nil {
			return n, txs, err
		}
		if rv == 0 {
			if rv, err = tr.GetReadVersion().Get(); err != nil {
				return n, txs, err
			}
		}
		txs++
		n += len(kvs)
		if len(kvs) < perTx {
			return n, txs, nil
		}
		begin = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
	}
	return n, txs, ctx.Err()
}

// preloadPerTx is how many objects one preload transaction writes.
const preloadPerTx = 100

// ensureObjects writes the object set if the create-txn row did not (it
// was filtered out or ran out of time): blind sets of every object, 16
// transactions at a time. Checking is one untimed read of the range.
func (c *client) ensureObjects(ctx context.Context, perTx int) error {
	s := c.spec
	n, _, err := c.readRange(ctx, perTx)
	if err != nil || int64(n) >= int64(s.P.Objects) {
		return err
	}
	val := value(s.Values[0])
	ops := make([]func(context.Context, int64) error, 16)
	for w := range ops {
		ops[w] = func(_ context.Context, i int64) error {
			_, err := c.db.Transact(func(tr fdb.Transaction) (interface{}, error) {
				for k := i * preloadPerTx; k < min((i+1)*preloadPerTx, int64(s.P.Objects)); k++ {
					tr.Set(c.key(objectID(k)), val)
				}
				return nil, nil
			})
			return err
		}
	}
	txs := (int64(s.P.Objects) + preloadPerTx - 1) / preloadPerTx
	r := workload.Loop{Bound: s.P.TxnTimeCap, MaxOps: txs, OpTimeout: s.P.OpTimeout}.Run(ctx, ops)
	if r.Ops < txs {
		return fmt.Errorf("wrote %d of %d transactions: %v", r.Ops, txs, r.FirstErr)
	}
	return nil
}
