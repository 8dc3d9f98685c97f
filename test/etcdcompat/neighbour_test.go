package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// neighbourKeys are keys the tests use too (the random sequences' \x00 and
// \xff edges, the lease and maintenance tests' names): a Range, a watch or
// a Txn compare of the tenant under test reaching the neighbour's keyspace
// would meet them.
var neighbourKeys = []string{"\x00", "\x00\x00", "a", "ab", "b", "plain", "e1", "stay", "d1", "m0", "foo", "z", "\xff", "\xff\xff"}

// neighbourLeases are the explicit lease IDs the lease tests grant: held by
// the neighbour for the whole test, so a grant of the same ID by the tenant
// under test answers "lease already exists" if lease IDs leaked.
var neighbourLeases = []int64{1000, 1001, 1002, 2000, 2100, 3001, 3002, 3003}

// neighbourPace is the pause between two requests of the neighbour: a few
// hundred writes a second, load enough to interleave with every request of
// a test without starving a 2-core machine.
const neighbourPace = 3 * time.Millisecond

// neighbour is a second tenant of the candidate, busy for the whole test.
// It is the only writer of its tenant, so every answer's revision is known
// in advance: a write must answer exactly one past the last, a read the
// last. Its watch from revision 1 must deliver its own writes and nothing
// else, and its keyspace must hold exactly its model.
type neighbour struct {
	s *server

	stop     chan struct{} // closed by finish: the write loop ends
	loopDone chan struct{} // closed when the write loop returned
	progress chan struct{} // signalled (capacity 1) when the watch matched an event or failed
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the write loop and the watch reader

	// Written by the loop only (and read after loopDone).
	rev       int64
	compacted int64
	model     map[string]string

	mu      sync.Mutex
	pending []string // guarded by mu: own events not yet seen on the watch, oldest first
	early   []string // guarded by mu: watch events that came before their write's answer
	seen    int64    // guarded by mu: revision of the last event the watch delivered
	err     error    // guarded by mu: first failure
}

// startNeighbour connects to the candidate at hostport as tenant
// neighbourTenant, sets its keys and leases up (before the test sends
// anything) and keeps writing until the test ends; then it reports what
// it saw go wrong.
func startNeighbour(t *testing.T, hostport string) {
	t.Helper()
	s, err := dialServer("neighbour", hostport, tenantPKI.clientTLS(neighbourTenant))
	if err != nil {
		t.Fatalf("neighbour tenant: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &neighbour{s: s, stop: make(chan struct{}), loopDone: make(chan struct{}), progress: make(chan struct{}, 1), cancel: cancel, rev: 1, model: map[string]string{}}
	if err := n.setup(ctx); err != nil {
		cancel()
		s.close()
		t.Fatalf("neighbour tenant setup: %v", err)
	}
	n.wg.Add(2)
	go n.watch(ctx)
	go n.loop()
	t.Cleanup(func() { n.finish(t) })
}

func (n *neighbour) fail(err error) {
	n.mu.Lock()
	if n.err == nil {
		n.err = err
	}
	n.mu.Unlock()
	n.signal()
}

func (n *neighbour) signal() {
	select {
	case n.progress <- struct{}{}:
	default:
	}
}

// setup grants neighbourLeases and writes neighbourKeys, one attached to a
// lease, checking every revision.
func (n *neighbour) setup(ctx context.Context) error {
	for _, id := range neighbourLeases {
		r, err := n.s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: 3600})
		if err != nil {
			return fmt.Errorf("LeaseGrant %d: %w", id, err)
		}
		if err := n.expectRead(r.Header, "LeaseGrant"); err != nil {
			return err
		}
	}
	for i, k := range neighbourKeys {
		var lease int64
		if i == 0 {
			lease = neighbourLeases[0]
		}
		if err := n.put(ctx, k, "neighbour-setup", lease); err != nil {
			return err
		}
	}
	return nil
}

// expectRead checks the header of an answer that writes nothing.
func (n *neighbour) expectRead(h *pb.ResponseHeader, what string) error {
	if h.GetRevision() != n.rev {
		return fmt.Errorf("%s answered revision %d; the neighbour's own writes put it at %d: another tenant's writes moved it", what, h.GetRevision(), n.rev)
	}
	return nil
}

// expectWrite checks the header of one write and records its events.
func (n *neighbour) expectWrite(h *pb.ResponseHeader, what string, events ...string) error {
	if h.GetRevision() != n.rev+1 {
		return fmt.Errorf("%s answered revision %d, want %d (one past the neighbour's last write): another tenant's writes moved it", what, h.GetRevision(), n.rev+1)
	}
	n.rev++
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range events {
		if err := n.pairLocked(&n.early, &n.pending, fmt.Sprintf("rev=%d %s", n.rev, e)); err != nil {
			return err
		}
	}
	return nil
}

// pairLocked matches e, one side's new event, with the oldest unmatched
// event of the other side (queue other), or queues it on its own side
// (mine) until the other side has it: the watch may deliver a write's
// event before the write's answer arrives. The caller holds mu.
func (n *neighbour) pairLocked(other, mine *[]string, e string) error {
	if len(*other) == 0 {
		*mine = append(*mine, e)
		return nil
	}
	if (*other)[0] != e {
		return fmt.Errorf("the neighbour's watch and its writes disagree: %s against %s", e, (*other)[0])
	}
	*other = (*other)[1:]
	n.signal()
	return nil
}

func (n *neighbour) put(ctx context.Context, k, v string, lease int64) error {
	r, err := n.s.kv.Put(ctx, &pb.PutRequest{Key: []byte(k), Value: []byte(v), Lease: lease})
	if err != nil {
		return fmt.Errorf("Put %q: %w", k, err)
	}
	n.model[k] = v
	return n.expectWrite(r.Header, "Put "+k, fmt.Sprintf("PUT %q=%q", k, v))
}

// loop sends one request every neighbourPace until stop.
func (n *neighbour) loop() {
	defer n.wg.Done()
	defer close(n.loopDone)
	tick := time.NewTicker(neighbourPace)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := ctxOp()
		err := n.step(ctx, i)
		cancel()
		if err != nil {
			n.fail(fmt.Errorf("neighbour request #%d: %w", i, err))
			return
		}
	}
}

// step is request i of the neighbour's mix: puts, deletes, Txns, leases
// revoked with their keys, compactions, Status and a check of its whole
// keyspace.
func (n *neighbour) step(ctx context.Context, i int) error {
	k := neighbourKeys[i%len(neighbourKeys)]
	switch {
	case i%100 == 99:
		return n.compact(ctx)
	case i%20 == 19:
		return n.checkKeyspace(ctx)
	case i%20 == 9:
		st, err := n.s.maint.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			return fmt.Errorf("Status: %w", err)
		}
		return n.expectRead(st.Header, "Status")
	case i%25 == 11:
		return n.leaseCycle(ctx, k, i)
	case i%10 == 3:
		return n.deleteKey(ctx, k)
	case i%10 == 7:
		return n.txn(ctx, k, i)
	default:
		return n.put(ctx, k, fmt.Sprintf("n%d", i), 0)
	}
}

func (n *neighbour) deleteKey(ctx context.Context, k string) error {
	r, err := n.s.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(k)})
	if err != nil {
		return fmt.Errorf("DeleteRange %q: %w", k, err)
	}
	if _, ok := n.model[k]; !ok {
		if r.Deleted != 0 {
			return fmt.Errorf("DeleteRange %q deleted %d keys the neighbour never wrote", k, r.Deleted)
		}
		return n.expectRead(r.Header, "DeleteRange of an absent key")
	}
	if r.Deleted != 1 {
		return fmt.Errorf("DeleteRange %q deleted %d keys, want 1", k, r.Deleted)
	}
	delete(n.model, k)
	return n.expectWrite(r.Header, "DeleteRange "+k, fmt.Sprintf("DELETE %q", k))
}

// txn puts k if it still holds the neighbour's value (or is absent): a
// compare that met another tenant's value would fail.
func (n *neighbour) txn(ctx context.Context, k string, i int) error {
	cmp := &pb.Compare{Key: []byte(k), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 0}}
	if v, ok := n.model[k]; ok {
		cmp = &pb.Compare{Key: []byte(k), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte(v)}}
	}
	v := fmt.Sprintf("t%d", i)
	r, err := n.s.kv.Txn(ctx, &pb.TxnRequest{Compare: []*pb.Compare{cmp},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}}}})
	if err != nil {
		return fmt.Errorf("Txn on %q: %w", k, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("Txn compare on %q failed: the key holds something the neighbour did not write", k)
	}
	n.model[k] = v
	return n.expectWrite(r.Header, "Txn "+k, fmt.Sprintf("PUT %q=%q", k, v))
}

// leaseCycle grants a lease with a server-chosen ID, attaches a key and
// revokes it, which deletes the key.
func (n *neighbour) leaseCycle(ctx context.Context, k string, i int) error {
	g, err := n.s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	if err != nil {
		return fmt.Errorf("LeaseGrant: %w", err)
	}
	if err := n.expectRead(g.Header, "LeaseGrant"); err != nil {
		return err
	}
	lk := "lease/" + k
	if err := n.put(ctx, lk, fmt.Sprintf("l%d", i), g.ID); err != nil {
		return err
	}
	r, err := n.s.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: g.ID})
	if err != nil {
		return fmt.Errorf("LeaseRevoke %d: %w", g.ID, err)
	}
	delete(n.model, lk)
	return n.expectWrite(r.Header, "LeaseRevoke", fmt.Sprintf("DELETE %q", lk))
}

func (n *neighbour) compact(ctx context.Context) error {
	to := n.rev - 10
	if to <= n.compacted {
		return nil
	}
	r, err := n.s.kv.Compact(ctx, &pb.CompactionRequest{Revision: to})
	if err != nil {
		return fmt.Errorf("Compact %d: %w", to, err)
	}
	n.compacted = to
	return n.expectRead(r.Header, "Compact")
}

// checkKeyspace reads the neighbour's whole keyspace: it must be its model.
func (n *neighbour) checkKeyspace(ctx context.Context) error {
	r, err := n.s.kv.Range(ctx, allRange(0))
	if err != nil {
		return fmt.Errorf("Range of everything: %w", err)
	}
	if err := n.expectRead(r.Header, "Range of everything"); err != nil {
		return err
	}
	got := make([]string, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		got = append(got, fmt.Sprintf("%q=%q", kv.Key, kv.Value))
	}
	keys := make([]string, 0, len(n.model))
	for k := range n.model {
		keys = append(keys, k)
	}
	sort.Strings(keys) // byte order, as Range returns them
	want := make([]string, 0, len(keys))
	for _, k := range keys {
		want = append(want, fmt.Sprintf("%q=%q", k, n.model[k]))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("the neighbour's keyspace holds\n  %v\nwant what it wrote\n  %v", got, want)
	}
	return nil
}

// watch follows every key of the neighbour's tenant from revision 1 and
// matches each event with the oldest of its writes not yet seen.
func (n *neighbour) watch(ctx context.Context) {
	defer n.wg.Done()
	if err := n.follow(ctx); err != nil && ctx.Err() == nil {
		n.fail(fmt.Errorf("neighbour watch: %w", err))
	}
}

func (n *neighbour) follow(ctx context.Context) error {
	ws, err := n.s.watch.Watch(ctx)
	if err != nil {
		return err
	}
	create := &pb.WatchCreateRequest{Key: []byte("\x00"), RangeEnd: []byte("\x00"), StartRevision: 1}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
		return err
	}
	for {
		resp, err := ws.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("watch stream ended")
			}
			return err
		}
		if resp.Canceled {
			return fmt.Errorf("watch canceled: %s", resp.CancelReason)
		}
		for _, ev := range resp.Events {
			if err := n.match(ev); err != nil {
				return err
			}
		}
	}
}

func (n *neighbour) match(ev *mvccpb.Event) error {
	got := fmt.Sprintf("rev=%d DELETE %q", ev.Kv.ModRevision, ev.Kv.Key)
	if ev.Type == mvccpb.PUT {
		got = fmt.Sprintf("rev=%d PUT %q=%q", ev.Kv.ModRevision, ev.Kv.Key, ev.Kv.Value)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seen = ev.Kv.ModRevision
	return n.pairLocked(&n.pending, &n.early, got)
}

// finish stops the writes, waits (generously) for the watch to deliver
// the last of them, stops the watch and reports the first failure.
func (n *neighbour) finish(t *testing.T) {
	close(n.stop)
	<-n.loopDone
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for waiting := true; waiting; {
		n.mu.Lock()
		done, seen := len(n.pending) == 0 && len(n.early) == 0 || n.err != nil, n.seen
		n.mu.Unlock()
		if done {
			break
		}
		select {
		case <-n.progress:
		case <-timeout.C:
			n.fail(fmt.Errorf("neighbour watch stopped at revision %d, its writes reached %d", seen, n.rev))
			waiting = false
		}
	}
	n.cancel()
	n.wg.Wait()
	n.s.close()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		t.Errorf("tenant %q beside tenant %q: %v", neighbourTenant, compatTenant, n.err)
		return
	}
	t.Logf("tenant %q beside the test: %d writes, compacted at %d, all its own, each seen once on its watch", neighbourTenant, n.rev-1, n.compacted)
}
