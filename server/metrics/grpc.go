package metrics

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/fdb-etcd/fdb-etcd/server/errmap"
)

// grpcMetrics are go-grpc-prometheus' server metrics, under its names and
// labels, with the handling-time histogram enabled as etcd enables it.
type grpcMetrics struct {
	started     *prometheus.CounterVec
	handled     *prometheus.CounterVec
	msgReceived *prometheus.CounterVec
	msgSent     *prometheus.CounterVec
	handling    *prometheus.HistogramVec

	// methods caches each method's series (FullMethod -> *methodSeries):
	// looking them up by label values hashed the labels five times per
	// call, a few percent of a small read's CPU.
	methods sync.Map
}

// methodSeries are one method's series; handled only for code OK, the
// others are rare enough to look up.
type methodSeries struct {
	typ, service, method string
	started, received    prometheus.Counter
	sent, handledOK      prometheus.Counter
	handling             prometheus.Observer
}

func (g *grpcMetrics) series(full, typ string) *methodSeries {
	if v, ok := g.methods.Load(full); ok {
		return v.(*methodSeries)
	}
	service, method := splitMethod(full)
	ms := &methodSeries{
		typ: typ, service: service, method: method,
		started:   g.started.WithLabelValues(typ, service, method),
		received:  g.msgReceived.WithLabelValues(typ, service, method),
		sent:      g.msgSent.WithLabelValues(typ, service, method),
		handledOK: g.handled.WithLabelValues(typ, service, method, codes.OK.String()),
		handling:  g.handling.WithLabelValues(typ, service, method),
	}
	v, _ := g.methods.LoadOrStore(full, ms)
	return v.(*methodSeries)
}

func (g *grpcMetrics) handledBy(ms *methodSeries, err error) {
	code := errmap.Wire(err).Code()
	if code == codes.OK {
		ms.handledOK.Inc()
		return
	}
	g.handled.WithLabelValues(ms.typ, ms.service, ms.method, code.String()).Inc()
}

var grpcCodes = []codes.Code{
	codes.OK, codes.Canceled, codes.Unknown, codes.InvalidArgument, codes.DeadlineExceeded, codes.NotFound,
	codes.AlreadyExists, codes.PermissionDenied, codes.ResourceExhausted, codes.FailedPrecondition, codes.Aborted,
	codes.OutOfRange, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss, codes.Unauthenticated,
}

func newGRPCMetrics(f factory) *grpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &grpcMetrics{
		started: f.counterVec(prometheus.CounterOpts{Name: "grpc_server_started_total",
			Help: "Total number of RPCs started on the server."}, labels),
		handled: f.counterVec(prometheus.CounterOpts{Name: "grpc_server_handled_total",
			Help: "Total number of RPCs completed on the server, regardless of success or failure."},
			append(labels[:3:3], "grpc_code")),
		msgReceived: f.counterVec(prometheus.CounterOpts{Name: "grpc_server_msg_received_total",
			Help: "Total number of RPC stream messages received on the server."}, labels),
		msgSent: f.counterVec(prometheus.CounterOpts{Name: "grpc_server_msg_sent_total",
			Help: "Total number of gRPC stream messages sent by the server."}, labels),
		handling: f.histogramVec(prometheus.HistogramOpts{Name: "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: prometheus.DefBuckets}, labels),
	}
}

const (
	unary        = "unary"
	clientStream = "client_stream"
	serverStream = "server_stream"
	bidiStream   = "bidi_stream"
)

func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.Index(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", full
}

func streamType(client, server bool) string {
	switch {
	case client && server:
		return bidiStream
	case client:
		return clientStream
	case server:
		return serverStream
	}
	return unary
}

// InitializeGRPC creates every series of every registered method at zero,
// as go-grpc-prometheus' InitializeMetrics does, so that rates exist before
// the first call. Call it after registering the services.
func (m *Metrics) InitializeGRPC(srv *grpc.Server) {
	if m == nil {
		return
	}
	for service, info := range srv.GetServiceInfo() {
		for _, mi := range info.Methods {
			t := streamType(mi.IsClientStream, mi.IsServerStream)
			m.grpc.series("/"+service+"/"+mi.Name, t)
			for _, c := range grpcCodes {
				m.grpc.handled.WithLabelValues(t, service, mi.Name, c.String())
			}
		}
	}
}

// UnaryServerInterceptor measures unary calls and counts etcd's mvcc
// operations from KV requests.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ms := m.grpc.series(info.FullMethod, unary)
		ms.started.Inc()
		ms.received.Inc()
		start := time.Now()
		resp, err := handler(ctx, req)
		m.grpc.handledBy(ms, err)
		ms.handling.Observe(time.Since(start).Seconds())
		if err == nil {
			ms.sent.Inc()
			m.countKV(req, resp)
		}
		return resp, err
	}
}

// StreamServerInterceptor measures streaming calls and their messages.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ms := m.grpc.series(info.FullMethod, streamType(info.IsClientStream, info.IsServerStream))
		ms.started.Inc()
		start := time.Now()
		err := handler(srv, &countingStream{ServerStream: ss, recv: ms.received, sent: ms.sent})
		m.grpc.handledBy(ms, err)
		ms.handling.Observe(time.Since(start).Seconds())
		return err
	}
}

type countingStream struct {
	grpc.ServerStream
	recv, sent prometheus.Counter
}

func (s *countingStream) SendMsg(msg any) error {
	err := s.ServerStream.SendMsg(msg)
	if err == nil {
		s.sent.Inc()
	}
	return err
}

func (s *countingStream) RecvMsg(msg any) error {
	err := s.ServerStream.RecvMsg(msg)
	if err == nil {
		s.recv.Inc()
	}
	return err
}

// kvOps counts the operations a request executed.
type kvOps struct{ ranges, puts, deletes int }

// countKV feeds etcd's etcd_mvcc_{range,put,delete,txn}_total the way etcd
// counts them: every executed operation, including those inside the taken
// branch of a transaction (recursively), and a txn for every request that
// executed more than one operation.
func (m *Metrics) countKV(req, resp any) {
	var ops kvOps
	switch r := req.(type) {
	case *pb.RangeRequest:
		ops.ranges = 1
	case *pb.PutRequest:
		ops.puts = 1
	case *pb.DeleteRangeRequest:
		ops.deletes = 1
	case *pb.TxnRequest:
		tr, _ := resp.(*pb.TxnResponse)
		countTxn(r, tr, &ops)
	default:
		return
	}
	m.rangeTotal.Add(float64(ops.ranges))
	m.putTotal.Add(float64(ops.puts))
	m.deleteTotal.Add(float64(ops.deletes))
	if ops.ranges+ops.puts+ops.deletes > 1 {
		m.txnTotal.Inc()
	}
}

func countTxn(r *pb.TxnRequest, resp *pb.TxnResponse, ops *kvOps) {
	if resp == nil {
		return
	}
	branch := r.Failure
	if resp.Succeeded {
		branch = r.Success
	}
	for i, op := range branch {
		switch {
		case op.GetRequestRange() != nil:
			ops.ranges++
		case op.GetRequestPut() != nil:
			ops.puts++
		case op.GetRequestDeleteRange() != nil:
			ops.deletes++
		case op.GetRequestTxn() != nil:
			var sub *pb.TxnResponse
			if i < len(resp.Responses) {
				sub = resp.Responses[i].GetResponseTxn()
			}
			countTxn(op.GetRequestTxn(), sub, ops)
		}
	}
}
