package tenant

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Noisy neighbours: how much one tenant's load slows another's requests.
// Tenant B puts at a modest rate and watches its own prefix; tenant A is
// quiet, then runs a write storm, then holds 10,000 watchers that its own
// writes keep busy. B's put and watch-delivery p99 in each phase, and
// their ratios to the quiet phase, are the result.
const (
	noisyPhase      = 15 * time.Second
	victimRate      = 50 // B's puts per second
	stormClients    = 64 // A's concurrent writers in the storm
	noisyWatchers   = 10000
	watchersPerConn = 100 // A's watchers per gRPC watch stream
	watchedRate     = 5   // A's puts per second while its watchers hold
)

// BenchmarkNoisyNeighbour measures B alone, B beside A's write storm and B
// beside A's 10,000 watchers, with each tenant's requests in flight
// bounded as by default and unbounded. Run once: go test ./tenant -run
// '^$' -bench NoisyNeighbour -benchtime 1x -timeout 20m
func BenchmarkNoisyNeighbour(b *testing.B) {
	for _, inflight := range []int{16, 0} {
		b.Run(fmt.Sprintf("max-inflight=%d", inflight), func(b *testing.B) { noisyNeighbour(b, inflight) })
	}
}

func noisyNeighbour(b *testing.B, maxInflight int) {
	e := startRouter(b, false, func(c *Config) { c.MaxInflight = maxInflight })
	e.create("noisy", "victim")
	victim := e.dial(e.clientCert("victim"))
	defer victim.Close()
	noisy := make([]*clientv3.Client, 8)
	for i := range noisy {
		noisy[i] = e.dial(e.clientCert("noisy"))
		defer noisy[i].Close()
	}
	b.ResetTimer()
	for range b.N {
		quiet := runVictim(b, victim, func(context.Context) {})
		storm := runVictim(b, victim, func(ctx context.Context) { writeStorm(ctx, noisy) })
		watchers := runVictim(b, victim, func(ctx context.Context) { holdWatchers(b, ctx, noisy) })
		for _, p := range []struct {
			name string
			l    latencies
		}{{"quiet", quiet}, {"storm", storm}, {"watchers", watchers}} {
			b.ReportMetric(ms(p.l.put), "put-p99-ms-"+p.name)
			b.ReportMetric(ms(p.l.watch), "watch-p99-ms-"+p.name)
		}
		b.ReportMetric(ratio(storm.put, quiet.put), "put-p99-x-storm")
		b.ReportMetric(ratio(storm.watch, quiet.watch), "watch-p99-x-storm")
		b.ReportMetric(ratio(watchers.put, quiet.put), "put-p99-x-watchers")
		b.ReportMetric(ratio(watchers.watch, quiet.watch), "watch-p99-x-watchers")
	}
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }

func ratio(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }

// latencies are B's p99s in one phase.
type latencies struct{ put, watch time.Duration }

// runVictim runs noise for a phase while B puts victimRate times a second
// (open loop) and watches what it puts; it returns B's p99s.
func runVictim(b *testing.B, cli *clientv3.Client, noise func(context.Context)) latencies {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var noiseDone sync.WaitGroup
	noiseDone.Add(1)
	go func() { defer noiseDone.Done(); noise(ctx) }()
	defer noiseDone.Wait()
	time.Sleep(time.Second) // the noise at full strength first

	phase := fmt.Sprintf("p%d/", time.Now().UnixNano())
	wch := cli.Watch(ctx, phase, clientv3.WithPrefix())
	sent := make(map[string]time.Time)
	var mu sync.Mutex
	var puts, deliveries []time.Duration
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		for resp := range wch {
			now := time.Now()
			mu.Lock()
			for _, ev := range resp.Events {
				if t, ok := sent[string(ev.Kv.Key)]; ok {
					deliveries = append(deliveries, now.Sub(t))
				}
			}
			mu.Unlock()
		}
	}()
	n := int(noisyPhase.Seconds()) * victimRate
	tick := time.NewTicker(time.Second / victimRate)
	defer tick.Stop()
	var wg sync.WaitGroup
	for i := range n {
		<-tick.C
		key := phase + fmt.Sprint(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			start := time.Now()
			sent[key] = start
			mu.Unlock()
			if _, err := cli.Put(ctx, key, "v"); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			puts = append(puts, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	time.Sleep(2 * time.Second) // the last deliveries
	cancel()
	<-delivered
	mu.Lock()
	defer mu.Unlock()
	if len(deliveries) < n {
		b.Logf("%d of %d events delivered to B's watch", len(deliveries), n)
	}
	return latencies{put: p99(puts), watch: p99(deliveries)}
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}

// writeStorm puts as fast as stormClients closed loops can until ctx ends.
func writeStorm(ctx context.Context, clis []*clientv3.Client) {
	val := strings.Repeat("x", 256)
	var wg sync.WaitGroup
	for i := range stormClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := clis[i%len(clis)]
			for j := 0; ctx.Err() == nil; j++ {
				_, _ = cli.Put(ctx, fmt.Sprintf("storm/%d/%d", i, j%1000), val)
			}
		}()
	}
	wg.Wait()
}

// holdWatchers opens noisyWatchers watchers on A's prefix, over raw watch
// streams that discard what they receive (clientv3's watchers would cost
// this process more than the server), and puts watchedRate times a second
// so that every watcher has events to be sent.
func holdWatchers(b *testing.B, ctx context.Context, clis []*clientv3.Client) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for s := range noisyWatchers / watchersPerConn {
		stream, err := pb.NewWatchClient(clis[s%len(clis)].ActiveConnection()).Watch(ctx, grpc.ForceCodecV2(discardCodec{}))
		if err != nil {
			b.Error(err)
			return
		}
		for range watchersPerConn {
			req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
				Key: []byte("watched/"), RangeEnd: []byte("watched0")}}}
			if err := stream.Send(req); err != nil {
				b.Error(err)
				return
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stream.RecvMsg(&discarded{}) == nil {
			}
		}()
	}
	tick := time.NewTicker(time.Second / watchedRate)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_, _ = clis[0].Put(ctx, fmt.Sprintf("watched/%d", i%100), "v")
		}
	}
}

// discardCodec marshals requests as protobuf and drops responses
// undecoded; its name is "proto", so the server sees an ordinary call.
type discardCodec struct{}

// discarded is a response discardCodec dropped.
type discarded struct{}

func (discardCodec) Name() string { return "proto" }

func (discardCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("discardCodec: cannot marshal %T", v)
	}
	raw, err := proto.Marshal(m)
	return mem.BufferSlice{mem.SliceBuffer(raw)}, err
}

func (discardCodec) Unmarshal(mem.BufferSlice, any) error { return nil }

var _ encoding.CodecV2 = discardCodec{}
