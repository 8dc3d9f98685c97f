package workload

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// All returns every workload for the given parameters, in report order.
func All(p Params) []Workload {
	var ws []Workload
	for _, size := range p.PutSizes {
		for _, n := range p.PutClients {
			ws = append(ws, &Put{Clients: n, Size: size})
		}
	}
	ws = append(ws,
		&RangeOne{Clients: 16, Serializable: false},
		&RangeOne{Clients: 16, Serializable: true},
		&CreateTxn{Clients: 16, P: p},
		&List{Mode: ListUnpaginated, P: p},
		&List{Mode: ListPaginated, P: p},
		&List{Mode: ListCountOnly, P: p},
	)
	for _, rate := range p.WatchRates {
		for _, n := range p.Watchers {
			ws = append(ws, &WatchFanout{Watchers: n, Rate: rate})
		}
	}
	ws = append(ws,
		&ProgressRTT{},
		&WatcherRSS{P: p},
		&LeaseKeepAlive{Clients: 16},
		&LeaseGrantPut{Clients: 16},
		&LargeDelete{Keys: p.LargeDeleteKeys},
		&LargeDelete{Keys: p.LargeRevokeKeys, Revoke: true},
	)
	return append(ws, NoisyRows(p.NoisySlots)...)
}

// Put writes distinct keys of a fixed value size.
type Put struct {
	Clients int
	Size    int
}

func (w *Put) Group() string { return "put" }
func (w *Put) Name() string {
	return fmt.Sprintf("put %s, distinct keys, %d client%s", SizeLabel(w.Size), w.Clients, plural(w.Clients))
}

func (w *Put) prefix() string { return fmt.Sprintf("/bench/put/%d-%d/", w.Size, w.Clients) }

// Raw is one blind set of a new key per transaction.
func (w *Put) Raw(p Params) RawSpec {
	return RawSpec{Op: RawWrite, Batchable: true, Clients: w.Clients, Prefix: w.prefix(), Values: []int{w.Size}, P: p}
}

func (w *Put) Run(ctx context.Context, env *Env) (Result, error) {
	val := Value(w.Size)
	prefix := w.prefix()
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers:  w.Clients,
		Duration: env.P.Duration,
		MaxOps:   env.P.MaxOps,
		Op: func(ctx context.Context, c *clientv3.Client, i int64) error {
			_, err := c.Put(ctx, fmt.Sprintf("%s%010d", prefix, i), val)
			return err
		},
	})
	if err != nil {
		return Result{}, err
	}
	return ResultFrom(w, r), nil
}

// RangeOne reads a single key over and over.
type RangeOne struct {
	Clients      int
	Serializable bool
}

func (w *RangeOne) Group() string { return "range" }
func (w *RangeOne) Name() string {
	mode := "linearizable"
	if w.Serializable {
		mode = "serializable"
	}
	return fmt.Sprintf("range 1 key (256B), %s, %d clients", mode, w.Clients)
}

const rangeOneKey = "/bench/range/one"

// Raw is a fresh read version and one get (linearizable), or a get at a
// recently obtained read version (serializable).
func (w *RangeOne) Raw(p Params) RawSpec {
	op := RawGet
	if w.Serializable {
		op = RawGetRecent
	}
	return RawSpec{Op: op, Clients: w.Clients, Prefix: rangeOneKey, Values: []int{256}, P: p}
}

func (w *RangeOne) Run(ctx context.Context, env *Env) (Result, error) {
	key := rangeOneKey
	cli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	pctx, cancel := context.WithTimeout(ctx, env.P.OpTimeout)
	_, err = cli.Put(pctx, key, Value(256))
	cancel()
	cli.Close()
	if err != nil {
		return Result{}, err
	}
	var opts []clientv3.OpOption
	if w.Serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers:  w.Clients,
		Duration: env.P.Duration,
		MaxOps:   env.P.MaxOps,
		Op: func(ctx context.Context, c *clientv3.Client, i int64) error {
			resp, err := c.Get(ctx, key, opts...)
			if err == nil && len(resp.Kvs) != 1 {
				err = fmt.Errorf("range returned %d keys", len(resp.Kvs))
			}
			return err
		},
	})
	if err != nil {
		return Result{}, err
	}
	return ResultFrom(w, r), nil
}

// objectsPrefix holds the kube-like object set shared by CreateTxn and List.
const objectsPrefix = "/bench/objects/"

func objectKey(i int64) string { return fmt.Sprintf("%s%08d", objectsPrefix, i) }

// createTxn is kube-apiserver's create: put only if the key does not exist.
func createTxn(ctx context.Context, c *clientv3.Client, key, val string) (bool, error) {
	resp, err := c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// CreateTxn creates P.Objects keys of P.ObjectSize bytes with create txns.
type CreateTxn struct {
	Clients int
	P       Params // sizes for the row label
}

func (w *CreateTxn) Group() string { return "txn" }
func (w *CreateTxn) Name() string {
	p := w.P
	return fmt.Sprintf("create txn %s×%s, %d clients", CountLabel(p.Objects), SizeLabel(p.ObjectSize), w.Clients)
}

// Raw is a get of the key and a set if it is absent, in one transaction.
func (w *CreateTxn) Raw(p Params) RawSpec {
	return RawSpec{Op: RawCreate, Batchable: true, Clients: w.Clients, Prefix: objectsPrefix, Values: []int{p.ObjectSize}, P: p}
}

func (w *CreateTxn) Run(ctx context.Context, env *Env) (Result, error) {
	val := Value(env.P.ObjectSize)
	var created atomic.Int64
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers: w.Clients,
		MaxOps:  int64(env.P.Objects),
		TimeCap: env.P.TxnTimeCap,
		Op: func(ctx context.Context, c *clientv3.Client, i int64) error {
			ok, err := createTxn(ctx, c, objectKey(i), val)
			if ok {
				created.Add(1)
			}
			return err
		},
	})
	if err != nil {
		return Result{}, err
	}
	res := ResultFrom(w, r)
	note := fmt.Sprintf("%d/%d created in %s", created.Load(), env.P.Objects, r.Elapsed.Round(time.Millisecond))
	if res.Note != "" {
		note += "; " + res.Note
	}
	res.Note = note
	return res, nil
}

// ensureObjects makes sure the object set exists (in case the create-txn
// workload was filtered out or did not finish within its time cap).
func ensureObjects(ctx context.Context, env *Env) error {
	cli, err := env.NewClient()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, env.P.OpTimeout)
	resp, err := cli.Get(cctx, objectsPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	cli.Close()
	if err != nil {
		return err
	}
	if resp.Count >= int64(env.P.Objects) {
		return nil
	}
	env.Logf("  preloading %d objects (found %d)", env.P.Objects, resp.Count)
	val := Value(env.P.ObjectSize)
	r, err := RunLoad(ctx, env, LoadSpec{
		Workers: 16,
		MaxOps:  int64(env.P.Objects),
		TimeCap: env.P.TxnTimeCap,
		Op: func(ctx context.Context, c *clientv3.Client, i int64) error {
			_, err := createTxn(ctx, c, objectKey(i), val)
			return err
		},
	})
	if err != nil {
		return err
	}
	if r.Ops < int64(env.P.Objects) {
		return fmt.Errorf("preload wrote only %d of %d objects (%v)", r.Ops, env.P.Objects, r.FirstErr)
	}
	return nil
}

// ListMode selects a LIST variant.
type ListMode int

const (
	ListUnpaginated ListMode = iota
	ListPaginated
	ListCountOnly
)

// List times full reads of the object set.
type List struct {
	Mode ListMode
	P    Params // sizes for the row label
}

func (w *List) Group() string { return "list" }
func (w *List) Name() string {
	p := w.P
	set := fmt.Sprintf("%s×%s", CountLabel(p.Objects), SizeLabel(p.ObjectSize))
	switch w.Mode {
	case ListPaginated:
		return fmt.Sprintf("LIST %s, pages of %d at one revision", set, p.ListPage)
	case ListCountOnly:
		return fmt.Sprintf("count-only over %s keys", CountLabel(p.Objects))
	default:
		return fmt.Sprintf("LIST %s, unpaginated", set)
	}
}

// Raw reads the same bytes: the object set, in transactions of about a
// megabyte or of one page, all at one read version.
func (w *List) Raw(p Params) RawSpec {
	s := RawSpec{Op: RawList, Prefix: objectsPrefix, Values: []int{p.ObjectSize}, Page: int(p.ListPage), P: p}
	switch w.Mode {
	case ListPaginated:
		s.Op = RawListPages
	case ListCountOnly:
		s.Op = RawCount
	}
	return s
}

func (w *List) Run(ctx context.Context, env *Env) (Result, error) {
	if err := ensureObjects(ctx, env); err != nil {
		return Result{}, fmt.Errorf("preload: %w", err)
	}
	cli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	defer cli.Close()
	end := PrefixEnd(objectsPrefix)
	want := int64(env.P.Objects)
	var times []time.Duration
	var pages int
	// A slow server (kine pages at an old revision) can take minutes per
	// LIST: each run gets 5 minutes and no new run starts after 5 minutes.
	capAt := time.Now().Add(5 * time.Minute)
	for run := 0; run < env.P.ListRuns && time.Now().Before(capAt); run++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		t0 := time.Now()
		var got int64
		var err error
		switch w.Mode {
		case ListUnpaginated:
			var resp *clientv3.GetResponse
			resp, err = cli.Get(rctx, objectsPrefix, clientv3.WithRange(end))
			if err == nil {
				got = int64(len(resp.Kvs))
			}
		case ListCountOnly:
			var resp *clientv3.GetResponse
			resp, err = cli.Get(rctx, objectsPrefix, clientv3.WithRange(end), clientv3.WithCountOnly())
			if err == nil {
				got = resp.Count
			}
		case ListPaginated:
			got, pages, err = listPaged(rctx, cli, objectsPrefix, end, env.P.ListPage)
		}
		d := time.Since(t0)
		cancel()
		if err != nil {
			return Result{}, err
		}
		if got < want {
			return Result{}, fmt.Errorf("LIST returned %d keys, want at least %d", got, want)
		}
		times = append(times, d)
	}
	if len(times) == 0 {
		return Result{}, fmt.Errorf("no LIST completed")
	}
	res := TimedRuns(times, want)
	res.Row, res.Group = w.Name(), w.Group()
	if w.Mode == ListPaginated {
		res.Note += fmt.Sprintf("; %d pages", pages)
	}
	return res, nil
}

// TimedRuns is the Result of a few timed runs that each read keys keys: the
// median run, with the slowest as p99.
func TimedRuns(times []time.Duration, keys int64) Result {
	times = slices.Sorted(slices.Values(times))
	med := times[len(times)/2]
	return Result{
		Kind:  Time,
		Value: med.Seconds(),
		P50:   med,
		P99:   times[len(times)-1], // with few runs, p99 is the slowest run
		Max:   times[len(times)-1],
		Ops:   int64(len(times)),
		Note:  fmt.Sprintf("median of %d runs; %.0f keys/s", len(times), float64(keys)/med.Seconds()),
	}
}

// listPaged lists [key, end) like kube-apiserver: limit-sized pages, each
// continuing after the last key returned, all at the first page's revision.
func listPaged(ctx context.Context, c *clientv3.Client, key, end string, limit int64) (n int64, pages int, err error) {
	var rev int64
	for pages < 1_000_000 {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.Get(ctx, key, opts...)
		if err != nil {
			return n, pages, err
		}
		pages++
		if rev == 0 {
			rev = resp.Header.Revision
		}
		n += int64(len(resp.Kvs))
		if !resp.More || len(resp.Kvs) == 0 {
			return n, pages, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return n, pages, fmt.Errorf("too many pages")
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
