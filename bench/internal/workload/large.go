package workload

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/hist"
)

// LargeDelete times one request that deletes Keys keys at one revision —
// a DeleteRange of a prefix (etcdctl del --prefix), or the revoke of a
// lease holding them — while other clients keep putting, and reports those
// clients' put latency during the request: fdb-etcd cannot delete that many
// keys in one FoundationDB transaction and stages them, and other writes
// wait for the staging.
type LargeDelete struct {
	Keys   int
	Revoke bool
}

// largeOthers is how many clients put during the large request.
const largeOthers = 8

func (w *LargeDelete) Group() string { return "large" }
func (w *LargeDelete) Name() string {
	what := "DeleteRange of a prefix"
	if w.Revoke {
		what = "LeaseRevoke of a lease"
	}
	return fmt.Sprintf("%s with %dk keys (s); others' put p99 meanwhile", what, w.Keys/1000)
}

// Raw: a plain client clears a prefix with one range clear, in one
// transaction of a few bytes; what the row measures is deleting every key
// at one etcd revision, with their events, beside others' writes.
func (w *LargeDelete) Raw(Params) RawSpec {
	return RawSpec{None: "a plain client clears a prefix in one range clear; the row measures etcd's delete of every key at one revision, with events"}
}

func (w *LargeDelete) Run(ctx context.Context, env *Env) (Result, error) {
	cli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	defer cli.Close()
	prefix := fmt.Sprintf("/bench/large/%v/", w.Revoke)
	var lease clientv3.LeaseID
	if w.Revoke {
		g, err := cli.Grant(ctx, 3600)
		if err != nil {
			return Result{}, fmt.Errorf("grant: %w", err)
		}
		lease = g.ID
	}
	t0 := time.Now()
	if err := fillLarge(ctx, env, prefix, w.Keys, lease); err != nil {
		return Result{}, fmt.Errorf("fill: %w", err)
	}
	env.Logf("%s: filled %d keys in %v", w.Name(), w.Keys, time.Since(t0).Round(time.Millisecond))
	others, err := startOthers(ctx, env, prefix)
	if err != nil {
		return Result{}, err
	}
	time.Sleep(time.Second) // the others' latency before, for comparison
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	if w.Revoke {
		_, err = cli.Revoke(rctx, lease)
	} else {
		var d *clientv3.DeleteResponse
		d, err = cli.Delete(rctx, prefix, clientv3.WithPrefix())
		if err == nil && d.Deleted != int64(w.Keys) {
			err = fmt.Errorf("deleted %d keys, want %d", d.Deleted, w.Keys)
		}
	}
	cancel()
	took := time.Since(start)
	time.Sleep(time.Second)
	during, before, n := others.stop(start, start.Add(took))
	if err != nil {
		return Result{}, err
	}
	return Result{
		Row: w.Name(), Group: w.Group(), Kind: Time, Value: took.Seconds(),
		P50: during.Quantile(0.5), P99: during.Quantile(0.99), Max: during.Max(), Ops: int64(during.Count()),
		Errors: others.errors.Load(), Elapsed: took,
		Note: fmt.Sprintf("%d other clients: %d puts overlapped the request, p99 %v, max %v (before it: p99 %v); %d puts in all; %s",
			largeOthers, during.Count(), during.Quantile(0.99).Round(time.Microsecond), during.Max().Round(time.Microsecond),
			before.Quantile(0.99).Round(time.Microsecond), n, others.readNote(start, start.Add(took))),
	}, nil
}

// fillLarge puts n small keys under prefix in Txns of 128 puts (etcd's
// limit), from 16 clients.
func fillLarge(ctx context.Context, env *Env, prefix string, n int, lease clientv3.LeaseID) error {
	cs, err := env.Clients(env.Conns(16))
	if err != nil {
		return err
	}
	defer CloseAll(cs)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(c *clientv3.Client) {
			defer wg.Done()
			for {
				i := int(next.Add(128) - 128)
				if i >= n {
					return
				}
				ops := make([]clientv3.Op, 0, 128)
				for j := i; j < min(n, i+128); j++ {
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%07d", prefix, j), "value", clientv3.WithLease(lease)))
				}
				tctx, cancel := context.WithTimeout(ctx, env.P.OpTimeout)
				_, err := c.Txn(tctx).Then(ops...).Commit()
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}(cs[g%len(cs)])
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// others is the background load of a large-request row: clients putting
// distinct 256 B keys back to back, each put's start and latency recorded.
type others struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errors atomic.Int64
	mu     sync.Mutex
	puts   []timedOp
	counts []timedOp // count-only Ranges of the prefix being deleted
	ranges []timedOp // Ranges of largeRangeKeys keys of it
	gets   []timedOp // Gets of a key outside it
	cs     []*clientv3.Client
}

type timedOp struct {
	start time.Time
	took  time.Duration
}

func startOthers(ctx context.Context, env *Env, prefix string) (*others, error) {
	cs, err := env.Clients(env.Conns(largeOthers + 3))
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	o := &others{cancel: cancel, cs: cs}
	n := len(cs)
	o.read(lctx, env, cs[max(n-2, 0)], &o.counts, func(c context.Context, cli *clientv3.Client) error {
		_, err := cli.Get(c, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err
	})
	o.read(lctx, env, cs[max(n-3, 0)], &o.ranges, func(c context.Context, cli *clientv3.Client) error {
		_, err := cli.Get(c, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(largeRangeKeys))
		return err
	})
	o.read(lctx, env, cs[n-1], &o.gets, func(c context.Context, cli *clientv3.Client) error {
		_, err := cli.Get(c, "/bench/large-others/0/0")
		return err
	})
	val := Value(256)
	for g := 0; g < largeOthers; g++ {
		o.wg.Add(1)
		go func(c *clientv3.Client) {
			defer o.wg.Done()
			for i := 0; lctx.Err() == nil; i++ {
				t := time.Now()
				pctx, pcancel := context.WithTimeout(lctx, env.P.OpTimeout)
				_, err := c.Put(pctx, fmt.Sprintf("/bench/large-others/%d/%d", g, i), val)
				pcancel()
				switch {
				case lctx.Err() != nil:
					return
				case err != nil:
					o.errors.Add(1)
				default:
					o.mu.Lock()
					o.puts = append(o.puts, timedOp{t, time.Since(t)})
					o.mu.Unlock()
				}
			}
		}(cs[g%len(cs)])
	}
	return o, nil
}

// read runs op back to back on cli until ctx ends, recording each one
// that succeeded in ops.
func (o *others) read(ctx context.Context, env *Env, cli *clientv3.Client, ops *[]timedOp, op func(context.Context, *clientv3.Client) error) {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for ctx.Err() == nil {
			t := time.Now()
			rctx, cancel := context.WithTimeout(ctx, env.P.OpTimeout)
			err := op(rctx, cli)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				o.errors.Add(1)
			default:
				o.mu.Lock()
				*ops = append(*ops, timedOp{t, time.Since(t)})
				o.mu.Unlock()
			}
		}
	}()
}

// readNote describes the reads that overlapped [from, to], and those that
// finished before it: counts of the prefix being deleted, Ranges of its
// first largeRangeKeys keys, and Gets of a key outside it.
func (o *others) readNote(from, to time.Time) string {
	out := "meanwhile (before it)"
	for _, r := range []struct {
		what string
		ops  []timedOp
	}{{"counts of the prefix", o.counts}, {fmt.Sprintf("Ranges of %dk of its keys", largeRangeKeys/1000), o.ranges}, {"Gets of another key", o.gets}} {
		during, before := split(r.ops, from, to)
		out += fmt.Sprintf("; %d %s p50 %v max %v (p50 %v)", during.Count(), r.what,
			during.Quantile(0.5).Round(time.Microsecond), during.Max().Round(time.Microsecond), before.Quantile(0.5).Round(time.Microsecond))
	}
	return out
}

// largeRangeKeys is how many keys of the prefix being deleted one Range
// reads.
const largeRangeKeys = 20_000

// split returns the latencies of the ops that overlapped [from, to] and of
// those that finished before from.
func split(ops []timedOp, from, to time.Time) (during, before *hist.Histogram) {
	during, before = hist.New(), hist.New()
	for _, p := range ops {
		switch end := p.start.Add(p.took); {
		case end.Before(from):
			before.Record(p.took)
		case !p.start.After(to):
			during.Record(p.took)
		}
	}
	return during, before
}

// stop ends the load and returns the latencies of the puts that overlapped
// [from, to], of those that finished before from, and the number of puts.
func (o *others) stop(from, to time.Time) (during, before *hist.Histogram, n int) {
	o.cancel()
	o.wg.Wait()
	CloseAll(o.cs)
	during, before = split(o.puts, from, to)
	return during, before, len(o.puts)
}
