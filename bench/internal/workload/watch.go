package workload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/hist"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/servers"
)

// watchSet is a group of established watchers spread over a few client
// connections and gRPC watch streams.
type watchSet struct {
	cancel  context.CancelFunc
	clients []*clientv3.Client
	wg      sync.WaitGroup
	setup   time.Duration
}

// openWatchers starts n watchers; keyOf(i) gives watcher i's key, and each
// watches it as a prefix. onEvents is called from the watcher's goroutine for
// every response carrying events. It returns once every watcher has been
// confirmed created by the server.
func openWatchers(ctx context.Context, env *Env, n int, keyOf func(i int) string, onResp func(clientv3.WatchResponse)) (*watchSet, error) {
	streams := streamsFor(env, n)
	perStream := (n + streams - 1) / streams
	clients, err := env.Clients(env.Conns(streams))
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	ws := &watchSet{cancel: cancel, clients: clients}
	// clientv3 multiplexes all watches whose contexts carry the same
	// outgoing metadata onto one gRPC stream; distinct metadata gives
	// distinct streams.
	sctx := make([]context.Context, streams)
	for s := range sctx {
		sctx[s] = metadata.AppendToOutgoingContext(wctx, "bench-watch-stream", strconv.Itoa(s))
	}
	errs := make(chan error, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		s := i / perStream
		c := clients[s%len(clients)]
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			ch := c.Watch(sctx[s], keyOf(i), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			first, ok := <-ch
			if !ok || !first.Created || first.Err() != nil {
				err := first.Err()
				if err == nil {
					err = errors.New("watch channel closed before creation")
				}
				errs <- err
				return
			}
			errs <- nil
			for resp := range ch {
				if len(resp.Events) > 0 {
					onResp(resp)
				}
			}
		}()
	}
	if err := ws.awaitCreated(ctx, env, n, n, errs); err != nil {
		return nil, err
	}
	ws.setup = time.Since(start)
	return ws, nil
}

// streamsFor is how many watch streams n watchers are spread over:
// WatchersPerStream to a stream, and at least one stream per replica, so
// every replica delivers.
func streamsFor(env *Env, n int) int {
	perStream := max(env.P.WatchersPerStream, 1)
	streams := (n + perStream - 1) / perStream
	if r := len(env.Endpoints); streams < r {
		streams = min(r, n)
	}
	return streams
}

// awaitCreated waits for reports on errs (nil: created; reports of them
// in all) for n watchers, within the setup limit. On failure it closes ws.
func (ws *watchSet) awaitCreated(ctx context.Context, env *Env, n, reports int, errs <-chan error) error {
	limit := 2 * time.Minute
	if env.P.Quick {
		limit = 30 * time.Second
	}
	timeout := time.After(limit)
	for range reports {
		select {
		case err := <-errs:
			if err != nil {
				ws.Close()
				return err
			}
		case <-timeout:
			ws.Close()
			return fmt.Errorf("only some of %d watchers created within %s", n, limit)
		case <-ctx.Done():
			ws.Close()
			return ctx.Err()
		}
	}
	return nil
}

// Close cancels every watcher and closes the clients.
func (ws *watchSet) Close() {
	ws.cancel()
	CloseAll(ws.clients)
	done := make(chan struct{})
	go func() { ws.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
	}
}

// WatchFanout measures event delivery latency to many prefix watchers while
// one writer (one connection, open loop) puts at a fixed rate. The
// latency of an event is from just before its Put was issued to when a
// watcher received it, so it includes the write's commit.
type WatchFanout struct {
	Watchers int
	Rate     int // writes per second
}

func (w *WatchFanout) Group() string { return "watch" }
func (w *WatchFanout) Name() string {
	return fmt.Sprintf("watch fan-out: %d prefix watchers, 1 writer @%d/s (p50 latency)", w.Watchers, w.Rate)
}

func (w *WatchFanout) prefix() string { return fmt.Sprintf("/bench/watch/%d-%d/", w.Watchers, w.Rate) }

// Raw is the latency of a write's delivery through one FoundationDB watch:
// see cmd/fdb-raw for why one watch serves every watcher.
func (w *WatchFanout) Raw(p Params) RawSpec {
	return RawSpec{Op: RawWatch, Clients: 1, Prefix: w.prefix(), Rate: w.Rate, Watchers: w.Watchers, P: p}
}

func (w *WatchFanout) Run(ctx context.Context, env *Env) (Result, error) {
	prefix := w.prefix()
	d := NewDelivery()
	ws, err := openRawWatchers(ctx, env, w.Watchers, prefix, func(values [][]byte, err error) {
		if err != nil {
			d.Bad.Add(1)
			return
		}
		now := time.Now()
		for _, v := range values {
			d.Record(now, v)
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer ws.Close()

	wcli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	defer wcli.Close()
	wr := OpenLoop{Rate: w.Rate, Duration: env.P.WatchDuration, OpTimeout: env.P.OpTimeout}.Run(ctx, func(ctx context.Context, i int64) error {
		_, err := wcli.Put(ctx, fmt.Sprintf("%sk%03d", prefix, i%100), Stamp(time.Now()))
		return err
	})
	res, err := d.Result(ctx, wr, w.Rate, int64(w.Watchers), env.P.WatchGrace)
	if err != nil {
		return Result{}, err
	}
	res.Row, res.Group = w.Name(), w.Group()
	res.Note += fmt.Sprintf("; watcher setup %s", ws.setup.Round(time.Millisecond))
	return res, nil
}

// Stamp is the value a watch row writes: the time just before the write
// was issued, which its delivery is measured from.
func Stamp(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// Delivery tallies what the watchers of a watch row received.
type Delivery struct {
	h              *hist.Histogram
	delivered, Bad atomic.Int64
}

// NewDelivery returns an empty tally.
func NewDelivery() *Delivery { return &Delivery{h: hist.New()} }

// Record counts one event, received at now, whose value is a Stamp.
func (d *Delivery) Record(now time.Time, value []byte) {
	ts, err := strconv.ParseInt(string(value), 10, 64)
	if err != nil {
		d.Bad.Add(1)
		return
	}
	d.h.Record(time.Duration(now.UnixNano() - ts))
	d.delivered.Add(1)
}

// Result waits up to grace for every written event to reach each of
// receivers, then reports the delivery latency (p50 as the value).
func (d *Delivery) Result(ctx context.Context, wr OpenLoopResult, target int, receivers int64, grace time.Duration) (Result, error) {
	if wr.Written == 0 {
		if wr.FirstErr != nil {
			return Result{}, fmt.Errorf("writer: %w", wr.FirstErr)
		}
		return Result{}, errors.New("writer wrote nothing")
	}
	expected := wr.Written * receivers
	graceEnd := time.Now().Add(grace)
	for d.delivered.Load() < expected && time.Now().Before(graceEnd) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	got := d.delivered.Load()
	if got == 0 {
		return Result{}, fmt.Errorf("no event delivered (%d expected)", expected)
	}
	return Result{
		Kind:    Time,
		Value:   d.h.Quantile(0.5).Seconds(),
		P50:     d.h.Quantile(0.5),
		P99:     d.h.Quantile(0.99),
		Max:     d.h.Max(),
		Ops:     got,
		Errors:  wr.Errors + d.Bad.Load(),
		Elapsed: wr.Elapsed,
		Caveat:  DeliveryCaveat(wr.Rate, target, got, expected),
		Note: fmt.Sprintf("delivered %d/%d (%.1f%%) within %s grace; %d writes issued at %.0f/s, each took p50 %s p99 %s",
			got, expected, 100*float64(got)/float64(expected), grace, wr.Written, wr.Rate,
			wr.Took.Quantile(0.5).Round(10*time.Microsecond), wr.Took.Quantile(0.99).Round(10*time.Microsecond)) + wr.FailureNote(),
	}, nil
}

// OpenLoop is a writer on a fixed schedule: write i is issued at
// start+i/Rate on its own goroutine, at most MaxInflight (default 64) at a
// time, for Duration; if the server falls that far behind, the schedule
// slips and the achieved rate drops below the target.
type OpenLoop struct {
	Rate        int
	Duration    time.Duration
	OpTimeout   time.Duration
	MaxInflight int
}

// OpenLoopResult is what an OpenLoop did.
type OpenLoopResult struct {
	Issued, Written, Errors int64
	FirstErr                error
	// Rate is the achieved issue rate (writes/s); Elapsed runs until the
	// last write returned.
	Rate    float64
	Elapsed time.Duration
	// Took is how long each write that succeeded took, from its issue to
	// its return: the part of a watch row's delivery latency that is the
	// write's own commit.
	Took *hist.Histogram
}

// Run issues the writes and waits for all of them.
func (l OpenLoop) Run(ctx context.Context, write func(ctx context.Context, i int64) error) OpenLoopResult {
	total := int64(float64(l.Rate) * l.Duration.Seconds())
	interval := time.Second / time.Duration(l.Rate)
	sem := make(chan struct{}, cmp.Or(l.MaxInflight, 64))
	wctx, cancel := context.WithTimeout(ctx, 2*l.Duration+l.OpTimeout)
	defer cancel()
	r := OpenLoopResult{Took: hist.New()}
	var written, errs atomic.Int64
	var firstErr firstError
	var wg sync.WaitGroup
	start := time.Now()
schedule:
	for i := int64(0); i < total; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-time.After(d):
			case <-wctx.Done():
				break schedule
			}
		}
		select {
		case sem <- struct{}{}:
		case <-wctx.Done():
			break schedule
		}
		r.Issued++
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			octx, ocancel := context.WithTimeout(wctx, l.OpTimeout)
			defer ocancel()
			issued := time.Now()
			if err := write(octx, i); err != nil {
				errs.Add(1)
				firstErr.Set(err)
				return
			}
			r.Took.Record(time.Since(issued))
			written.Add(1)
		}()
	}
	r.Rate = float64(r.Issued) / (time.Since(start) + interval).Seconds()
	wg.Wait()
	r.Elapsed = time.Since(start)
	r.Written, r.Errors, r.FirstErr = written.Load(), errs.Load(), firstErr.Get()
	return r
}

// FailureNote is "" or a note on the writes that failed.
func (r OpenLoopResult) FailureNote() string {
	if r.FirstErr == nil {
		return ""
	}
	return fmt.Sprintf("; %d writes failed (a timed-out write may still commit and be delivered), first: %s", r.Errors, ShortErr(r.FirstErr))
}

// DeliveryCaveat says why a watch row's latencies are not comparable as
// they stand: the writer reached less than 95% of its target rate, or not
// every expected event arrived. "" when neither.
func DeliveryCaveat(rate float64, target int, got, expected int64) string {
	var caveats []string
	if rate < 0.95*float64(target) {
		caveats = append(caveats, fmt.Sprintf("%.0f w/s", rate))
	}
	if got < expected {
		caveats = append(caveats, fmt.Sprintf("%.1f%% delivered", 100*float64(got)/float64(expected)))
	}
	return strings.Join(caveats, ", ")
}

// ProgressRTT measures the round trip of RequestProgress on an idle watch
// stream: request, then wait for the progress notification.
type ProgressRTT struct{}

func (w *ProgressRTT) Group() string { return "progress" }
func (w *ProgressRTT) Name() string  { return "RequestProgress round trip, idle stream" }

// Raw: none. RequestProgress asks an etcd watch stream where it stands;
// FoundationDB has no watch stream to ask.
func (w *ProgressRTT) Raw(p Params) RawSpec {
	return RawSpec{None: "RequestProgress is an etcd watch-stream message; a plain FoundationDB client has no stream to ask"}
}

func (w *ProgressRTT) Run(ctx context.Context, env *Env) (Result, error) {
	cli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	defer cli.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wctx = metadata.AppendToOutgoingContext(wctx, "bench-watch-stream", "progress")
	// kube-apiserver opens its watches WithProgressNotify; kine only answers
	// progress requests for streams whose watches track progress.
	ch := cli.Watch(wctx, "/bench/progress/idle", clientv3.WithCreatedNotify(), clientv3.WithProgressNotify())
	select {
	case resp, ok := <-ch:
		if !ok || !resp.Created {
			return Result{}, fmt.Errorf("watch not created: %w", resp.Err())
		}
	case <-time.After(10 * time.Second):
		return Result{}, errors.New("watch not created within 10s")
	}
	h := hist.New()
	var timeouts int64
	timeout := 5 * time.Second
	start := time.Now()
	capAt := start.Add(2 * time.Minute)
	for round := 0; round < env.P.ProgressRounds && time.Now().Before(capAt); round++ {
		t0 := time.Now()
		if err := cli.RequestProgress(wctx); err != nil {
			return Result{}, fmt.Errorf("RequestProgress: %w", err)
		}
		timer := time.NewTimer(timeout)
		got := false
	wait:
		for {
			select {
			case resp, ok := <-ch:
				if !ok {
					timer.Stop()
					return Result{}, fmt.Errorf("watch closed: %w", resp.Err())
				}
				if resp.IsProgressNotify() {
					got = true
					break wait
				}
			case <-timer.C:
				break wait
			case <-ctx.Done():
				timer.Stop()
				return Result{}, ctx.Err()
			}
		}
		timer.Stop()
		if !got {
			if h.Count() == 0 {
				return Result{}, fmt.Errorf("no progress notification within %s (unsupported?)", timeout)
			}
			if timeouts++; timeouts >= 3 {
				break
			}
			continue
		}
		h.Record(time.Since(t0))
	}
	res := Result{
		Row:     w.Name(),
		Group:   w.Group(),
		Kind:    Time,
		Value:   h.Quantile(0.5).Seconds(),
		P50:     h.Quantile(0.5),
		P99:     h.Quantile(0.99),
		Max:     h.Max(),
		Ops:     int64(h.Count()),
		Errors:  timeouts,
		Elapsed: time.Since(start),
		Note:    fmt.Sprintf("%d round trips", h.Count()),
	}
	return res, nil
}

// WatcherRSS measures the server's resident memory with many idle watchers
// (each on its own prefix), on a freshly started server; with several
// replicas, the sum over them.
type WatcherRSS struct {
	P Params // for the row label
}

func (w *WatcherRSS) Group() string     { return "rss" }
func (w *WatcherRSS) FreshServer() bool { return true }
func (w *WatcherRSS) Name() string {
	return fmt.Sprintf("server RSS with %s idle watchers (MiB)", CountLabel(w.P.RSSWatchers))
}

// Raw: none. The row measures the memory a server spends on idle watchers;
// a plain FoundationDB client keeps no watchers for anyone.
func (w *WatcherRSS) Raw(p Params) RawSpec {
	return RawSpec{None: "the row measures a server's memory per idle watcher; a plain FoundationDB client serves no watchers"}
}

func (w *WatcherRSS) Run(ctx context.Context, env *Env) (Result, error) {
	if len(env.PIDs) == 0 {
		return Result{}, errors.New("server pid unknown")
	}
	settle := 2 * time.Second
	if env.P.Quick {
		settle = 500 * time.Millisecond
	}
	time.Sleep(settle)
	before, err := totalRSS(env.PIDs)
	if err != nil {
		return Result{}, err
	}
	n := env.P.RSSWatchers
	ws, err := openWatchers(ctx, env, n, func(i int) string { return fmt.Sprintf("/bench/rss/%06d/", i) }, func(clientv3.WatchResponse) {})
	if err != nil {
		return Result{}, err
	}
	defer ws.Close()
	time.Sleep(settle)
	after, err := totalRSS(env.PIDs)
	if err != nil {
		return Result{}, err
	}
	delta := after - before
	var of string
	if len(env.PIDs) > 1 {
		of = fmt.Sprintf("sum of %d replicas; ", len(env.PIDs))
	}
	return Result{
		Row:   w.Name(),
		Group: w.Group(),
		Kind:  Bytes,
		Value: float64(after),
		Ops:   int64(n),
		Note: fmt.Sprintf("%sfresh server %.1f MiB before, %+.1f MiB for %d watchers (%.1f KiB each); setup %s",
			of, float64(before)/(1<<20), float64(delta)/(1<<20), n, float64(delta)/1024/float64(n), ws.setup.Round(time.Millisecond)),
	}, nil
}

func totalRSS(pids []int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		n, err := servers.RSS(pid)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}
