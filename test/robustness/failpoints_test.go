package robustness

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
)

// noFailpoint only lets the traffic run (storage faults, when configured,
// are on for the whole run).
type noFailpoint struct{ d time.Duration }

func (noFailpoint) name() string { return "none" }
func (f noFailpoint) inject(ctx context.Context, _ *testing.T, _ *server, _ *runEnv) ([]report.ClientReport, string, error) {
	select {
	case <-time.After(f.d):
	case <-ctx.Done():
	}
	return nil, fmt.Sprintf("none (%v)", f.d), nil
}

// killFailpoint kills fdb-etcd with SIGKILL and restarts it on the same data
// directory and port, kills times.
type killFailpoint struct{ kills int }

func (killFailpoint) name() string { return "kill-9" }
func (f killFailpoint) inject(ctx context.Context, _ *testing.T, s *server, _ *runEnv) ([]report.ClientReport, string, error) {
	for i := 0; i < f.kills; i++ {
		if i > 0 {
			// Spaced so that each restart sees traffic resume: every kill
			// leaves in-flight writes of unknown outcome, and too many of
			// them at once make linearization checking intractable.
			time.Sleep(time.Duration(2000+rand.Intn(2000)) * time.Millisecond)
		}
		s.kill9()
		time.Sleep(time.Duration(rand.Intn(300)) * time.Millisecond)
		if err := s.start(); err != nil {
			return nil, "", err
		}
	}
	return nil, fmt.Sprintf("%d SIGKILLs, each restarted on the same data dir", f.kills), nil
}

// stalledWatchFailpoint opens watch streams on the whole keyspace, each on
// its own connection, and does not read them for stall while traffic and
// compaction go on; the server's sends back up into flow control. Then it
// reads them until they catch up with the head and hands the responses to the
// validator like any recorded watch.
type stalledWatchFailpoint struct {
	streams int
	stall   time.Duration
}

func (stalledWatchFailpoint) name() string { return "stalled-watch" }

type rawWatch struct {
	conn   *grpc.ClientConn
	stream pb.Watch_WatchClient
	req    model.WatchRequest
}

func (f stalledWatchFailpoint) inject(ctx context.Context, t *testing.T, s *server, env *runEnv) ([]report.ClientReport, string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, "", err
	}
	defer cli.Close()
	head, err := cli.Get(ctx, "tombstone")
	if err != nil {
		return nil, "", err
	}
	rssBefore := s.rssKiB()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var ws []*rawWatch
	for i := 0; i < f.streams; i++ {
		conn, err := grpc.NewClient(s.endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32))) // as clientv3
		if err != nil {
			return nil, "", err
		}
		defer conn.Close()
		st, err := pb.NewWatchClient(conn).Watch(wctx)
		if err != nil {
			return nil, "", err
		}
		// Start a little in the past so the stream begins as a catching-up
		// watcher, then falls behind again while stalled.
		rev := max(head.Header.Revision-int64(rand.Intn(20)), 1)
		req := model.WatchRequest{Key: "", Revision: rev, WithPrefix: true, WithProgressNotify: true, WithPrevKV: true}
		if err := st.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: rev, PrevKv: true, ProgressNotify: true,
		}}}); err != nil {
			return nil, "", err
		}
		ws = append(ws, &rawWatch{conn: conn, stream: st, req: req})
	}
	var rssMax int64
	for end := time.Now().Add(f.stall); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		rssMax = max(rssMax, s.rssKiB())
	}
	// Meanwhile the server must keep serving everyone else (the bound is
	// generous: this machine is shared; a server blocked by the stalled
	// streams stays blocked).
	getStart := time.Now()
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = cli.Get(pctx, "key0")
	pcancel()
	if err != nil {
		return nil, "", fmt.Errorf("a Get while watchers are stalled: %w", err)
	}
	getTook := time.Since(getStart)
	target, err := cli.Get(ctx, "tombstone")
	if err != nil {
		return nil, "", err
	}
	var reports []report.ClientReport
	events, canceled := 0, 0
	for _, w := range ws {
		op := model.WatchOperation{Request: w.req}
		for {
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			resp, err := recvWithContext(rctx, w.stream)
			rcancel()
			if err != nil {
				return nil, "", fmt.Errorf("draining a stalled watch: %w", err)
			}
			if resp.Created && len(resp.Events) == 0 && !resp.Canceled {
				continue // clientv3 does not pass creation responses on
			}
			wr := clientv3.WatchResponse{Header: resp.Header, Events: resp.Events, CompactRevision: resp.CompactRevision, Canceled: resp.Canceled}
			op.Responses = append(op.Responses, client.ToWatchResponse(wr, env.baseTime))
			events += len(resp.Events)
			if resp.Canceled {
				canceled++
				break
			}
			if resp.Header.Revision >= target.Header.Revision && (len(resp.Events) == 0 || resp.Events[len(resp.Events)-1].Kv.ModRevision >= target.Header.Revision) {
				break
			}
		}
		reports = append(reports, report.ClientReport{ClientID: env.ids.NewClientID(), Watch: []model.WatchOperation{op}})
	}
	wcancel()
	return reports, fmt.Sprintf("%d watch streams stalled %v (RSS %d -> max %d KiB, a Get meanwhile took %v), then drained: %d events, %d canceled by compaction",
		f.streams, f.stall, rssBefore, rssMax, getTook.Round(time.Millisecond), events, canceled), nil
}

func recvWithContext(ctx context.Context, st pb.Watch_WatchClient) (*pb.WatchResponse, error) {
	type res struct {
		r   *pb.WatchResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := st.Recv()
		ch <- res{r, err}
	}()
	select {
	case r := <-ch:
		return r.r, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
