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

// Noisy neighbours: how much one tenant's load slows another's requests
// on one server. Tenant B puts NoisyRate times a second (open loop) and
// watches what it puts; tenant A is quiet, or runs a write storm of
// NoisyStorm closed-loop clients, or holds NoisyWatchers watchers that its
// writes at NoisyWatchRate keep busy. Each row is one of A's three loads;
// its value is B's put p99, and the details give B's watch-delivery p99
// and both ratios to the quiet row of the same server and slots.

// Noisy phases.
const (
	NoisyQuiet    = "quiet"
	NoisyStorm    = "write storm"
	NoisyWatchers = "watchers"
)

// Noisy is one row: B beside A's Phase, on a server started with
// --tenant-max-concurrent-requests=Slots.
type Noisy struct {
	Phase string
	Slots int
	// Quiet is shared by the rows of one Slots: the quiet row keeps B's
	// p99s there, per server, for the other rows' ratios.
	Quiet *NoisyBaseline
}

// NoisyBaseline holds B's quiet p99s per server.
type NoisyBaseline struct {
	mu sync.Mutex
	by map[string]noisyP99 // guarded by mu
}

// noisyP99 are B's p99s in one row.
type noisyP99 struct{ put, watch time.Duration }

// NoisyRows returns the rows of the noisy group: the three loads of A for
// each value of slots.
func NoisyRows(slots []int) []Workload {
	var ws []Workload
	for _, s := range slots {
		base := &NoisyBaseline{by: make(map[string]noisyP99)}
		for _, ph := range []string{NoisyQuiet, NoisyStorm, NoisyWatchers} {
			ws = append(ws, &Noisy{Phase: ph, Slots: s, Quiet: base})
		}
	}
	return ws
}

func (w *Noisy) Group() string { return "noisy" }

// Raw says why the plain FoundationDB client has no equivalent.
func (w *Noisy) Raw(Params) RawSpec {
	return RawSpec{None: "tenants of one server sharing its CPU: a plain client has no server to share"}
}

func (w *Noisy) Name() string {
	return fmt.Sprintf("noisy: tenant B's put p99 beside tenant A's %s, --tenant-max-concurrent-requests=%d", w.Phase, w.Slots)
}

// TenantServerArgs starts the server with the row's slots.
func (w *Noisy) TenantServerArgs() []string {
	return []string{fmt.Sprintf("--tenant-max-concurrent-requests=%d", w.Slots)}
}

func (w *Noisy) Run(ctx context.Context, env *Env) (Result, error) {
	a, err := env.Tenant("noisy-a")
	if err != nil {
		return Result{}, err
	}
	b, err := env.Tenant("noisy-b")
	if err != nil {
		return Result{}, err
	}
	nctx, stopNoise := context.WithCancel(ctx)
	noise, err := w.startNoise(nctx, a)
	if err != nil {
		stopNoise()
		return Result{}, err
	}
	time.Sleep(time.Second) // A's load at full strength before B starts
	p99, res, err := victim(ctx, b)
	stopNoise()
	noiseNote := noise()
	if err != nil {
		return Result{}, err
	}
	res.Note += "; A: " + noiseNote + w.ratios(env.Server, p99)
	return res, nil
}

// ratios keeps the quiet row's p99s or renders this row's against them.
func (w *Noisy) ratios(server string, p noisyP99) string {
	w.Quiet.mu.Lock()
	defer w.Quiet.mu.Unlock()
	if w.Phase == NoisyQuiet {
		w.Quiet.by[server] = p
		return ""
	}
	q, ok := w.Quiet.by[server]
	if !ok || q.put <= 0 || q.watch <= 0 {
		return "; no quiet row to compare with"
	}
	return fmt.Sprintf("; put p99 %.2f× quiet, watch p99 %.2f× quiet",
		p.put.Seconds()/q.put.Seconds(), p.watch.Seconds()/q.watch.Seconds())
}

// startNoise starts A's load and returns the function that waits for it
// to end (after ctx) and describes what it did.
func (w *Noisy) startNoise(ctx context.Context, a *Env) (func() string, error) {
	switch w.Phase {
	case NoisyQuiet:
		return func() string { return "quiet" }, nil
	case NoisyStorm:
		return startStorm(ctx, a)
	case NoisyWatchers:
		return startWatched(ctx, a)
	}
	return nil, fmt.Errorf("unknown noisy phase %q", w.Phase)
}

// startStorm runs NoisyStorm closed-loop putters of A until ctx ends.
func startStorm(ctx context.Context, a *Env) (func() string, error) {
	clients, err := a.Clients(a.Conns(a.P.NoisyStorm))
	if err != nil {
		return nil, err
	}
	val := Value(256)
	ops := make([]func(context.Context, int64) error, a.P.NoisyStorm)
	for i := range ops {
		c := clients[i%len(clients)]
		ops[i] = func(ctx context.Context, j int64) error {
			_, err := c.Put(ctx, fmt.Sprintf("/noisy/storm/%d", j%10000), val)
			return err
		}
	}
	done := make(chan LoadResult, 1)
	go func() {
		done <- Loop{Bound: time.Hour, MaxOps: 1 << 62, OpTimeout: a.P.OpTimeout}.Run(ctx, ops)
	}()
	return func() string {
		r := <-done
		CloseAll(clients)
		return fmt.Sprintf("%d clients, %.0f puts/s, p99 %s", a.P.NoisyStorm, r.Throughput(), r.Hist.Quantile(0.99))
	}, nil
}

// startWatched opens NoisyWatchers watchers of A's prefix and puts to it
// NoisyWatchRate times a second until ctx ends, so that each put is an
// event for every watcher.
func startWatched(ctx context.Context, a *Env) (func() string, error) {
	const prefix = "/noisy/watched/"
	var events atomic.Int64
	ws, err := openRawWatchers(ctx, a, a.P.NoisyWatchers, prefix, func(values [][]byte, err error) {
		events.Add(int64(len(values)))
	})
	if err != nil {
		return nil, err
	}
	wcli, err := a.NewClient()
	if err != nil {
		ws.Close()
		return nil, err
	}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second / time.Duration(a.P.NoisyWatchRate))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = wcli.Put(ctx, fmt.Sprintf("%sk%d", prefix, i%100), "v")
			}
		}
	}()
	return func() string {
		<-done
		ws.Close()
		wcli.Close()
		return fmt.Sprintf("%d watchers, %.0f events/s delivered", a.P.NoisyWatchers, float64(events.Load())/time.Since(start).Seconds())
	}, nil
}

// victim is B: NoisyRate puts a second for NoisyPhase, each stamped, on a
// key its own watch receives; it returns B's p99s and the row's result.
func victim(ctx context.Context, b *Env) (noisyP99, Result, error) {
	cli, err := b.NewClient()
	if err != nil {
		return noisyP99{}, Result{}, err
	}
	defer cli.Close()
	prefix := fmt.Sprintf("/noisy/b/%d/", time.Now().UnixNano())
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if r := <-wch; !r.Created {
		return noisyP99{}, Result{}, fmt.Errorf("B's watch not created: %v", r.Err())
	}
	d := NewDelivery()
	go func() {
		for r := range wch {
			now := time.Now()
			for _, ev := range r.Events {
				d.Record(now, ev.Kv.Value)
			}
		}
	}()
	puts := hist.New()
	wr := OpenLoop{Rate: b.P.NoisyRate, Duration: b.P.NoisyPhase, OpTimeout: b.P.OpTimeout}.Run(ctx, func(ctx context.Context, i int64) error {
		t0 := time.Now()
		_, err := cli.Put(ctx, fmt.Sprintf("%s%d", prefix, i), Stamp(t0))
		if err == nil {
			puts.Record(time.Since(t0))
		}
		return err
	})
	res, err := d.Result(ctx, wr, b.P.NoisyRate, 1, b.P.WatchGrace)
	if err != nil {
		return noisyP99{}, Result{}, err
	}
	p := noisyP99{put: puts.Quantile(0.99), watch: res.P99}
	res.Note = fmt.Sprintf("B: put p50 %s p99 %s, watch p50 %s p99 %s; %s", puts.Quantile(0.5), p.put, res.P50, p.watch, res.Note)
	res.Value, res.P50, res.P99, res.Max = p.put.Seconds(), puts.Quantile(0.5), p.put, puts.Max()
	return p, res, nil
}
