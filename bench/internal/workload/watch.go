package workload

import (
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

func (w *WatchFanout) Run(ctx context.Context, env *Env) (Result, error) {
	prefix := fmt.Sprintf("/bench/watch/%d-%d/", w.Watchers, w.Rate)
	h := hist.New()
	var delivered, bad atomic.Int64
	ws, err := openRawWatchers(ctx, env, w.Watchers, prefix, func(values [][]byte, err error) {
		if err != nil {
			bad.Add(1)
			return
		}
		now := time.Now().UnixNano()
		for _, v := range values {
			ts, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				bad.Add(1)
				continue
			}
			h.Record(time.Duration(now - ts))
			delivered.Add(1)
		}
	})
	if err != nil {
		return Result{}, err
	}
	defer ws.Close()

	// Writer: open loop on one connection. Write i is issued at
	// start+i/Rate in its own goroutine, with at most maxInflight
	// outstanding; if the server falls that far behind, the schedule slips
	// and the achieved rate (in the note) drops below the target.
	total := int64(float64(w.Rate) * env.P.WatchDuration.Seconds())
	interval := time.Second / time.Duration(w.Rate)
	wcli, err := env.NewClient()
	if err != nil {
		return Result{}, err
	}
	defer wcli.Close()
	var written, werrs atomic.Int64
	var firstWErr firstError
	const maxInflight = 64
	sem := make(chan struct{}, maxInflight)
	wctx, wcancel := context.WithTimeout(ctx, 2*env.P.WatchDuration+env.P.OpTimeout)
	defer wcancel()
	start := time.Now()
	var issued int64
	var wg sync.WaitGroup
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
		issued++
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			octx, ocancel := context.WithTimeout(wctx, env.P.OpTimeout)
			defer ocancel()
			_, err := wcli.Put(octx, fmt.Sprintf("%sk%03d", prefix, i%100), strconv.FormatInt(time.Now().UnixNano(), 10))
			if err != nil {
				werrs.Add(1)
				firstWErr.Set(err)
				return
			}
			written.Add(1)
		}()
	}
	issueElapsed := time.Since(start)
	wg.Wait()
	writeElapsed := time.Since(start)
	if written.Load() == 0 {
		if e := firstWErr.Get(); e != nil {
			return Result{}, fmt.Errorf("writer: %w", e)
		}
		return Result{}, errors.New("writer wrote nothing")
	}
	expected := written.Load() * int64(w.Watchers)
	graceEnd := time.Now().Add(env.P.WatchGrace)
	for delivered.Load() < expected && time.Now().Before(graceEnd) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	got := delivered.Load()
	if got == 0 {
		return Result{}, fmt.Errorf("no event delivered (%d expected)", expected)
	}
	rate := float64(issued) / (issueElapsed + interval).Seconds()
	res := Result{
		Row:     w.Name(),
		Group:   w.Group(),
		Kind:    Time,
		Value:   h.Quantile(0.5).Seconds(),
		P50:     h.Quantile(0.5),
		P99:     h.Quantile(0.99),
		Max:     h.Max(),
		Ops:     got,
		Errors:  werrs.Load() + bad.Load(),
		Elapsed: writeElapsed,
		Note: fmt.Sprintf("delivered %d/%d (%.1f%%) within %s grace; %d writes issued at %.0f/s; watcher setup %s",
			got, expected, 100*float64(got)/float64(expected), env.P.WatchGrace,
			written.Load(), rate, ws.setup.Round(time.Millisecond)),
	}
	var caveats []string
	if rate < 0.95*float64(w.Rate) {
		caveats = append(caveats, fmt.Sprintf("%.0f w/s", rate))
	}
	if got < expected {
		caveats = append(caveats, fmt.Sprintf("%.1f%% delivered", 100*float64(got)/float64(expected)))
	}
	res.Caveat = strings.Join(caveats, ", ")
	if e := firstWErr.Get(); e != nil {
		res.Note += fmt.Sprintf("; %d writes failed (a timed-out write may still commit and be delivered), first: %s", werrs.Load(), ShortErr(e))
	}
	return res, nil
}

// ProgressRTT measures the round trip of RequestProgress on an idle watch
// stream: request, then wait for the progress notification.
type ProgressRTT struct{}

func (w *ProgressRTT) Group() string { return "progress" }
func (w *ProgressRTT) Name() string  { return "RequestProgress round trip, idle stream" }

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
