// Package workload defines the benchmark workloads and the small load
// generator they share. A new workload implements Workload and is added to
// All; the harness runs every workload against every server in turn and the
// report matches rows across servers by Workload.Name.
package workload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/hist"
)

// Kind says what Result.Value measures and which direction is better.
type Kind int

const (
	// Throughput is operations per second; higher is better.
	Throughput Kind = iota
	// Time is a duration in seconds; lower is better.
	Time
	// Bytes is a size in bytes (e.g. RSS); lower is better.
	Bytes
)

// HigherIsBetter reports the direction of the metric.
func (k Kind) HigherIsBetter() bool { return k == Throughput }

// Result is one cell group of the report: one workload on one server.
type Result struct {
	Server string  `json:"server"`
	Row    string  `json:"row"`
	Group  string  `json:"group"`
	Kind   Kind    `json:"kind"`
	Value  float64 `json:"value"` // ops/s, seconds or bytes, per Kind
	// Latency of individual operations (or of whole runs, for LIST).
	P50    time.Duration `json:"p50_ns,omitempty"`
	P99    time.Duration `json:"p99_ns,omitempty"`
	Max    time.Duration `json:"max_ns,omitempty"`
	Ops    int64         `json:"ops,omitempty"`
	Errors int64         `json:"errors,omitempty"`
	// Elapsed is the wall time of the measured phase.
	Elapsed time.Duration `json:"elapsed_ns,omitempty"`
	// Note carries workload-specific detail (delivered/expected, first
	// error, …).
	Note string `json:"note,omitempty"`
	// Caveat, when set, is shown next to the value in the main table: the
	// value is not comparable as is (e.g. the writer fell behind its target
	// rate, or not every event was delivered).
	Caveat string `json:"caveat,omitempty"`
	// NA, when set, says why there is no value (unsupported, failed, …).
	NA string `json:"na,omitempty"`
	// NoEquivalent, when set, says why a reference measurement (fdb-raw)
	// has nothing to compare with this row; the table shows a dash.
	NoEquivalent string `json:"no_equivalent,omitempty"`
	// CPU is what the processes used during the measured phase of a
	// closed-loop row (Loop), nil for other rows.
	CPU *CPU `json:"cpu,omitempty"`
}

// Workload is one row of the report.
type Workload interface {
	// Group is a short id used by -workloads filters (put, range, txn,
	// list, watch, progress, rss, lease, large).
	Group() string
	// Name is the row label; it must be identical for every server.
	Name() string
	// Run measures the workload against env's server. A returned error
	// becomes an n/a cell; partial failures belong in Result.Errors.
	Run(ctx context.Context, env *Env) (Result, error)
}

// FreshServer may be implemented by workloads that need a freshly started,
// empty server (e.g. memory measurements); the harness restarts the server
// before running them.
type FreshServer interface {
	FreshServer() bool
}

// TenantServer may be implemented by workloads of many tenants: the
// harness runs them on a fresh server serving a keyspace per client
// certificate, started with the flags TenantServerArgs returns, and shows
// n/a for servers without tenancy. Env.ClientTLS gives each tenant's
// clients their certificate.
type TenantServer interface {
	TenantServerArgs() []string
}

// Env is what a workload gets to talk to one running server.
type Env struct {
	Server string // etcd, kine, fdb-etcd, …
	// Endpoints holds host:port on loopback of each replica of the server
	// (one for all but fdb-etcd-fdb3); clients are spread over them.
	Endpoints []string
	PIDs      []int // server process ids (for RSS), one per replica
	P         Params
	Logf      func(format string, args ...any)
	// ClientTLS returns the TLS configuration of tenant cn's clients on a
	// server that serves tenants (TenantServer), and an error on others.
	ClientTLS func(cn string) (*tls.Config, error)

	next atomic.Uint64 // replica of the next NewClient
	tls  *tls.Config   // the clients' TLS, on an Env of one tenant (Tenant)
}

// Tenant returns an Env whose clients are tenant cn's, on a server that
// serves tenants (TenantServer).
func (e *Env) Tenant(cn string) (*Env, error) {
	if e.ClientTLS == nil {
		return nil, fmt.Errorf("%s serves no tenants", e.Server)
	}
	c, err := e.ClientTLS(cn)
	if err != nil {
		return nil, err
	}
	return &Env{Server: e.Server, Endpoints: e.Endpoints, PIDs: e.PIDs, P: e.P, Logf: e.Logf, ClientTLS: e.ClientTLS, tls: c}, nil
}

// Params sizes the workloads; Full and Quick give the two presets.
type Params struct {
	Quick bool
	// Duration of each time-bounded throughput run.
	Duration time.Duration
	// MaxOps bounds the operation count of any single run.
	MaxOps int64
	// Conns is the number of client connections a multi-client workload
	// spreads its goroutines over (rounded up to a multiple of the replica
	// count, see Env.Conns).
	Conns int
	// OpTimeout bounds each request.
	OpTimeout time.Duration
	// PutClients and PutSizes span the put matrix.
	PutClients []int
	PutSizes   []int
	// Objects and ObjectSize describe the kube-like object set used by the
	// create-txn and LIST workloads.
	Objects    int
	ObjectSize int
	// TxnTimeCap bounds the create-txn run.
	TxnTimeCap time.Duration
	// ListRuns is how many times each LIST variant is timed.
	ListRuns int
	// ListPage is the page size of the paginated LIST.
	ListPage int64
	// Watch fan-out matrix and phases.
	Watchers          []int
	WatchRates        []int
	WatchDuration     time.Duration
	WatchGrace        time.Duration
	WatchersPerStream int
	// RSSWatchers is the watcher count of the RSS measurement.
	RSSWatchers int
	// ProgressRounds is the number of RequestProgress round trips.
	ProgressRounds int
	// LargeDeleteKeys and LargeRevokeKeys size the large-request rows: a
	// DeleteRange of a prefix, and the revoke of a lease, with that many keys.
	LargeDeleteKeys, LargeRevokeKeys int
	// The noisy-neighbour rows: tenant B puts NoisyRate times a second for
	// NoisyPhase beside tenant A's NoisyStorm closed-loop putters or its
	// NoisyWatchers watchers, which A's NoisyWatchRate puts a second keep
	// busy, on servers started with each of NoisySlots
	// (--tenant-max-concurrent-requests).
	NoisyPhase                           time.Duration
	NoisyRate, NoisyStorm, NoisyWatchers int
	NoisyWatchRate                       int
	NoisySlots                           []int
}

// Full is the preset for `make bench`.
func Full() Params {
	return Params{
		Duration:          10 * time.Second,
		MaxOps:            5_000_000,
		Conns:             8,
		OpTimeout:         30 * time.Second,
		PutClients:        []int{1, 16, 256},
		PutSizes:          []int{256, 2048},
		Objects:           50_000,
		ObjectSize:        2048,
		TxnTimeCap:        10 * time.Minute,
		ListRuns:          5,
		ListPage:          500,
		Watchers:          []int{100, 1000, 10000},
		WatchRates:        []int{100, 1000},
		WatchDuration:     10 * time.Second,
		WatchGrace:        20 * time.Second,
		WatchersPerStream: 100,
		RSSWatchers:       10000,
		ProgressRounds:    1000,
		LargeDeleteKeys:   200_000,
		LargeRevokeKeys:   50_000,
		NoisyPhase:        15 * time.Second,
		NoisyRate:         50,
		NoisyStorm:        64,
		NoisyWatchers:     10_000,
		NoisyWatchRate:    5,
		NoisySlots:        []int{0, 8},
	}
}

// Quick is the smoke-test preset (whole run well under two minutes per
// server set on two cores, excluding builds).
func Quick() Params {
	p := Full()
	p.Quick = true
	p.Duration = time.Second
	p.MaxOps = 200_000
	p.Objects = 2000
	p.TxnTimeCap = 30 * time.Second
	p.ListRuns = 2
	p.Watchers = []int{100, 1000}
	p.WatchRates = []int{100}
	p.WatchDuration = time.Second
	p.WatchGrace = 3 * time.Second
	p.ProgressRounds = 50
	p.LargeDeleteKeys = 20_000
	p.LargeRevokeKeys = 5_000
	p.NoisyPhase = 3 * time.Second
	p.NoisyWatchers = 1000
	return p
}

// NewClient opens one clientv3 client to one of the server's replicas,
// taking them in turn.
func (e *Env) NewClient() (*clientv3.Client, error) {
	return e.clientTo(int((e.next.Add(1) - 1) % uint64(max(len(e.Endpoints), 1))))
}

// clientTo opens a client to replica r alone: one endpoint per client (not
// all of them, which clientv3 would balance per request) keeps each
// client's requests, and its watch and keep-alive streams, on one replica,
// as with a client behind a per-connection load balancer.
func (e *Env) clientTo(r int) (*clientv3.Client, error) {
	if len(e.Endpoints) == 0 {
		return nil, errors.New("no server endpoint")
	}
	return clientv3.New(clientv3.Config{
		Endpoints:          []string{e.Endpoints[r%len(e.Endpoints)]},
		DialTimeout:        5 * time.Second,
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: math.MaxInt32,
		MaxCallSendMsgSize: 16 << 20,
		TLS:                e.tls,
	})
}

// Conns is how many connections to spread worker goroutines over: P.Conns
// rounded up to a multiple of the replica count (never above workers), so
// that worker w on connection w mod Conns talks to replica w mod replicas
// and the replicas get equal shares of the clients.
func (e *Env) Conns(workers int) int {
	r := max(len(e.Endpoints), 1)
	c := (max(e.P.Conns, 1) + r - 1) / r * r
	return max(min(c, workers), 1)
}

// Clients opens n clients, client i to replica i mod the replica count;
// close them with CloseAll.
func (e *Env) Clients(n int) ([]*clientv3.Client, error) {
	if n < 1 {
		n = 1
	}
	cs := make([]*clientv3.Client, 0, n)
	for i := 0; i < n; i++ {
		c, err := e.clientTo(i)
		if err != nil {
			CloseAll(cs)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// CloseAll closes every client.
func CloseAll(cs []*clientv3.Client) {
	for _, c := range cs {
		c.Close()
	}
}

// LoadSpec describes one closed-loop run: Workers goroutines each issue Op
// back to back until Duration passes or MaxOps operations were started.
type LoadSpec struct {
	Workers  int
	Conns    int           // client connections (≤ Workers); 0 = env.Conns
	Duration time.Duration // 0 = no time bound other than TimeCap
	MaxOps   int64         // required
	TimeCap  time.Duration // hard bound when Duration is 0
	// Op performs operation number i (0-based, unique across workers).
	Op func(ctx context.Context, c *clientv3.Client, i int64) error
	// NewWorker, when set instead of Op, builds per-worker state (e.g. a
	// stream bound to the run's context, cancelled when the run ends) and
	// returns the worker's op and a cleanup.
	NewWorker func(runCtx context.Context, w int, c *clientv3.Client) (op func(ctx context.Context, i int64) error, cleanup func(), err error)
}

// LoadResult is what RunLoad measured.
type LoadResult struct {
	Ops      int64 // successful operations
	Errors   int64
	FirstErr error
	Elapsed  time.Duration
	Hist     *hist.Histogram
	CPU      *CPU
}

// Throughput is successful operations per second.
func (r LoadResult) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// RunLoad runs a closed-loop load against env's server.
func RunLoad(ctx context.Context, env *Env, s LoadSpec) (LoadResult, error) {
	if s.Workers < 1 {
		s.Workers = 1
	}
	if s.Conns < 1 || s.Conns > s.Workers {
		s.Conns = env.Conns(s.Workers)
	}
	if s.MaxOps <= 0 {
		return LoadResult{}, errors.New("RunLoad: MaxOps must be > 0")
	}
	bound := s.Duration
	if bound == 0 {
		bound = s.TimeCap
	}
	if bound == 0 {
		return LoadResult{}, errors.New("RunLoad: no time bound")
	}
	clients, err := env.Clients(s.Conns)
	if err != nil {
		return LoadResult{}, err
	}
	defer CloseAll(clients)

	runCtx, cancel := context.WithTimeout(ctx, bound+s.timeoutSlack(env))
	defer cancel()
	ops := make([]func(ctx context.Context, i int64) error, s.Workers)
	for w := range ops {
		c := clients[w%len(clients)]
		if s.NewWorker == nil {
			ops[w] = func(ctx context.Context, i int64) error { return s.Op(ctx, c, i) }
			continue
		}
		op, cleanup, err := s.NewWorker(runCtx, w, c)
		if err != nil {
			return LoadResult{}, fmt.Errorf("worker setup: %w", err)
		}
		ops[w] = op
		if cleanup != nil {
			defer cleanup()
		}
	}
	r := Loop{Bound: bound, MaxOps: s.MaxOps, OpTimeout: env.P.OpTimeout, ServerPIDs: env.PIDs}.Run(runCtx, ops)
	return r, r.Err(ctx)
}

// Loop is one closed-loop run: a goroutine per op issues it back to back
// until Bound passes, MaxOps operations were started (counted over all
// workers) or ctx ends; each operation gets OpTimeout, and more than 1000
// consecutive failures end the run. The harness and the plain FoundationDB
// client (cmd/fdb-raw) measure with the same loop.
type Loop struct {
	Bound     time.Duration
	MaxOps    int64
	OpTimeout time.Duration
	// ServerPIDs are the processes of the server under test, whose CPU the
	// run reports with the fdbservers' and its own (LoadResult.CPU).
	ServerPIDs []int
}

// Run runs ops[w] on worker w's goroutine; i numbers the operations
// uniquely across workers, from 0.
func (l Loop) Run(ctx context.Context, ops []func(ctx context.Context, i int64) error) LoadResult {
	h := hist.New()
	var next, ok, errs atomic.Int64
	var firstErr firstError
	// Consecutive failures abort the run early (e.g. unsupported request).
	var consecutive atomic.Int64
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu0 := sampleCPU(l.ServerPIDs)
	start := time.Now()
	deadline := start.Add(l.Bound)
	var wg sync.WaitGroup
	for _, op := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil && time.Now().Before(deadline) {
				i := next.Add(1) - 1
				if i >= l.MaxOps {
					return
				}
				octx, ocancel := context.WithTimeout(runCtx, l.OpTimeout)
				t0 := time.Now()
				err := op(octx, i)
				d := time.Since(t0)
				ocancel()
				if err != nil {
					errs.Add(1)
					firstErr.Set(err)
					if consecutive.Add(1) > 1000 || runCtx.Err() != nil {
						cancel()
						return
					}
					continue
				}
				consecutive.Store(0)
				ok.Add(1)
				h.Record(d)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := sampleCPU(l.ServerPIDs).since(cpu0)
	return LoadResult{Ops: ok.Load(), Errors: errs.Load(), FirstErr: firstErr.Get(), Elapsed: elapsed, Hist: h, CPU: cpu}
}

// Err is the run's failure: its first error if nothing succeeded, else
// ctx's error (the run was cut short).
func (r LoadResult) Err(ctx context.Context) error {
	if r.Ops == 0 && r.FirstErr != nil {
		return r.FirstErr
	}
	if r.Ops == 0 {
		return errors.New("no operation completed")
	}
	return ctx.Err()
}

func (s LoadSpec) timeoutSlack(env *Env) time.Duration { return env.P.OpTimeout + 5*time.Second }

// ResultFrom fills a throughput Result for w from a LoadResult.
func ResultFrom(w Workload, r LoadResult) Result {
	res := r.Result()
	res.Row, res.Group = w.Name(), w.Group()
	return res
}

// Result is the throughput Result of the run (without row and server).
func (r LoadResult) Result() Result {
	res := Result{
		Kind:    Throughput,
		Value:   r.Throughput(),
		Ops:     r.Ops,
		Errors:  r.Errors,
		Elapsed: r.Elapsed,
		CPU:     r.CPU,
	}
	if r.Hist != nil {
		res.P50 = r.Hist.Quantile(0.50)
		res.P99 = r.Hist.Quantile(0.99)
		res.Max = r.Hist.Max()
	}
	if r.FirstErr != nil {
		res.Note = "first error: " + ShortErr(r.FirstErr)
	}
	return res
}

// ShortErr renders an error on one short line.
func ShortErr(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Code().String() + ": " + st.Message()
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 160 {
		msg = msg[:157] + "..."
	}
	return msg
}

// IsUnsupported reports whether err looks like the server does not
// implement the request.
func IsUnsupported(err error) bool {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unimplemented {
		return true
	}
	return false
}

// Value returns a payload of n bytes.
func Value(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return string(b)
}

// SizeLabel renders 256 as 256B and 2048 as 2KB.
func SizeLabel(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%dKB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

// CountLabel renders 50000 as 50k.
func CountLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// PrefixEnd returns the range end covering every key with prefix p.
func PrefixEnd(p string) string { return clientv3.GetPrefixRangeEnd(p) }

// firstError keeps the first error reported from many goroutines.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) Set(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

func (f *firstError) Get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
