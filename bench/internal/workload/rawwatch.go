package workload

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The fan-out rows receive on raw gRPC Watch streams instead of clientv3's
// Watch: clientv3 runs two goroutines and a channel hand-off per watcher, and
// at 10,000 watchers it took 1.4 of the host's 2 cores to receive what the
// server sent, so the row measured the load generator more than the server.
// A raw stream costs one goroutine per stream and reads each response in
// place, without decoding it into structs.

// rawWatchCodec marshals requests as protobuf and hands responses over
// undecoded. Its name is "proto", so the server sees an ordinary gRPC call.
type rawWatchCodec struct{}

func (rawWatchCodec) Name() string { return "proto" }

func (rawWatchCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("rawWatchCodec: cannot marshal %T", v)
	}
	return proto.Marshal(m)
}

func (rawWatchCodec) Unmarshal(data []byte, v any) error {
	r, ok := v.(*rawResponse)
	if !ok {
		return fmt.Errorf("rawWatchCodec: cannot unmarshal into %T", v)
	}
	r.b = append(r.b[:0], data...)
	return nil
}

// rawResponse is one WatchResponse in wire form.
type rawResponse struct{ b []byte }

var watchDesc = &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true, ClientStreams: true}

// WatchResponse and mvcc field numbers (etcd's rpc.proto and kv.proto), the
// only ones the fan-out rows read.
const (
	fWatchResponseCreated  = 3
	fWatchResponseCanceled = 4
	fWatchResponseEvents   = 11
	fEventKv               = 2
	fKeyValueValue         = 5
)

// parsedResponse is what the fan-out rows need of a WatchResponse.
type parsedResponse struct {
	created, canceled bool
	values            [][]byte // each event's kv.value, aliasing the response bytes
}

func parseWatchResponse(b []byte, out *parsedResponse) error {
	*out = parsedResponse{values: out.values[:0]}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case (num == fWatchResponseCreated || num == fWatchResponseCanceled) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if num == fWatchResponseCreated {
				out.created = v != 0
			} else {
				out.canceled = v != 0
			}
		case num == fWatchResponseEvents && typ == protowire.BytesType:
			ev, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			kv, err := field(ev, fEventKv)
			if err != nil {
				return err
			}
			val, err := field(kv, fKeyValueValue)
			if err != nil {
				return err
			}
			out.values = append(out.values, val)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// field returns the last occurrence of length-delimited field num in message
// b, or nil.
func field(b []byte, num protowire.Number) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		fn, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if fn == num && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			out, b = v, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(fn, typ, b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return out, nil
}

// openRawWatchers starts n watchers of prefix, WatchersPerStream to a raw
// stream, and returns once the server has confirmed every one. onEvents gets
// each response's event values (or the error that made it unreadable) from
// the stream's receive goroutine; the slices are valid only during the call.
func openRawWatchers(ctx context.Context, env *Env, n int, prefix string, onEvents func(values [][]byte, err error)) (*watchSet, error) {
	streams := streamsFor(env, n)
	clients, err := env.Clients(env.Conns(streams))
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	ws := &watchSet{cancel: cancel, clients: clients}
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
		Key: []byte(prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(prefix)),
	}}}
	start := time.Now()
	errs := make(chan error, streams)
	for s := range streams {
		k := n / streams
		if s < n%streams {
			k++
		}
		conn := clients[s%len(clients)].ActiveConnection()
		st, err := conn.NewStream(wctx, watchDesc, "/etcdserverpb.Watch/Watch", grpc.ForceCodec(rawWatchCodec{}))
		if err != nil {
			ws.Close()
			return nil, err
		}
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			receive(st, create, k, func(err error) { errs <- err }, onEvents)
		}()
	}
	if err := ws.awaitCreated(ctx, env, n, streams, errs); err != nil {
		return nil, err
	}
	ws.setup = time.Since(start)
	return ws, nil
}

// receive creates k watchers on st, calls ready once all are created (or
// with the error that stopped that), then hands every event response to
// onEvents until the stream ends.
func receive(st grpc.ClientStream, create *pb.WatchRequest, k int, ready func(error), onEvents func([][]byte, error)) {
	var raw rawResponse
	var resp parsedResponse
	err := func() error {
		for range k {
			if err := st.SendMsg(create); err != nil {
				return err
			}
		}
		for created := 0; created < k; {
			if err := st.RecvMsg(&raw); err != nil {
				return fmt.Errorf("watch stream ended before creation: %w", err)
			}
			if err := parseWatchResponse(raw.b, &resp); err != nil {
				return err
			}
			if resp.canceled {
				return errors.New("watch canceled at creation")
			}
			if resp.created {
				created++
			}
		}
		return nil
	}()
	ready(err)
	if err != nil {
		return
	}
	for st.RecvMsg(&raw) == nil {
		if err := parseWatchResponse(raw.b, &resp); err != nil || len(resp.values) > 0 {
			onEvents(resp.values, err)
		}
	}
}
