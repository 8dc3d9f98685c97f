// Package gateway is etcd's JSON gateway: /v3/* on the client port's
// HTTP/1.1 side translates JSON requests into gRPC calls on the server's own
// gRPC server and the answers back into JSON, with etcd's generated
// grpc-gateway handlers and etcd's JSON options, so curl scripts and
// non-Go clients get etcd's answers (streams, such as /v3/watch, as
// newline-delimited JSON, or as websocket messages).
//
// Like etcd, the gateway dials its own gRPC server, so every call passes the
// same interceptors (metrics, slow-request log) as a gRPC client's. It dials
// over an in-process pipe rather than the client port: the HTTP request
// already passed the port's TLS and client-certificate checks, and the pipe
// is reachable from nowhere else.
package gateway

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"

	gw "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/tmc/grpc-websocket-proxy/wsproxy"
	etcdgw "go.etcd.io/etcd/api/v3/etcdserverpb/gw"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// Server is what the gateway serves from: the server's gRPC server, which
// it serves on its own in-process listener.
type Server interface {
	Serve(l net.Listener) error
}

// Gateway is the /v3/ handler and its connection to the gRPC server.
type Gateway struct {
	lg      *zap.Logger
	lis     *pipeListener
	conn    *grpc.ClientConn
	handler http.Handler
	cancel  context.CancelFunc
	served  sync.WaitGroup
}

type register func(context.Context, *gw.ServeMux, *grpc.ClientConn) error

// Start serves srv on an in-process listener and builds the handlers of
// etcd's gateway for the KV, Watch, Lease, Cluster, Maintenance and Auth
// services; each answers what srv answers for its service, including for a
// service srv does not implement. srv must have all its services
// registered. Close stops both.
func Start(srv Server, lg *zap.Logger) (*Gateway, error) {
	g := &Gateway{lg: lg, lis: newPipeListener()}
	g.served.Add(1)
	go func() {
		defer g.served.Done()
		_ = srv.Serve(g.lis)
	}()
	conn, err := grpc.NewClient("passthrough:///fdb-etcd-gateway",
		grpc.WithContextDialer(g.lis.dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		g.lis.Close()
		g.served.Wait()
		return nil, err
	}
	g.conn = conn
	// The same JSON options as etcd's gateway (embed/serve.go).
	mux := gw.NewServeMux(gw.WithMarshalerOption(gw.MIMEWildcard, &gw.HTTPBodyMarshaler{
		Marshaler: &gw.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
		},
	}))
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	for _, h := range []register{
		etcdgw.RegisterKVHandler,
		etcdgw.RegisterWatchHandler,
		etcdgw.RegisterLeaseHandler,
		etcdgw.RegisterClusterHandler,
		etcdgw.RegisterMaintenanceHandler,
		etcdgw.RegisterAuthHandler,
	} {
		if err := h(ctx, mux, conn); err != nil {
			g.Close()
			return nil, err
		}
	}
	g.handler = mux
	return g, nil
}

// maxWebsocketMessage is etcd's bound on one websocket message of a stream
// (a JSON line): as large as the gRPC messages the server sends.
const maxWebsocketMessage = math.MaxInt32

// Handler serves /v3/ (and etcd's older /v3beta/ prefix). As etcd's, it
// also accepts websocket upgrades, which carry a stream's requests and
// answers as one message each, in both directions at once; the upgraded
// call is a POST whatever the handshake's method.
func (g *Gateway) Handler() http.Handler {
	ws := wsproxy.WebsocketProxy(g.handler,
		wsproxy.WithRequestMutator(func(_ *http.Request, out *http.Request) *http.Request {
			out.Method = http.MethodPost
			return out
		}),
		wsproxy.WithMaxRespBodyBufferSize(maxWebsocketMessage),
		wsproxy.WithLogger(wsLogger{g.lg}),
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v3beta/") {
			r.URL.Path = "/v3/" + strings.TrimPrefix(r.URL.Path, "/v3beta/")
		}
		ws.ServeHTTP(w, r)
	})
}

// wsLogger is the websocket proxy's logger.
type wsLogger struct{ lg *zap.Logger }

func (l wsLogger) Warnln(v ...any)  { l.lg.Warn(fmt.Sprint(v...)) }
func (l wsLogger) Debugln(v ...any) { l.lg.Debug(fmt.Sprint(v...)) }

// Close ends the gateway's calls and its listener.
func (g *Gateway) Close() {
	g.cancel()
	_ = g.conn.Close()
	g.lis.Close()
	g.served.Wait()
}

// pipeListener hands the server one end of an in-memory connection per
// dial.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	server, client := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		err := net.ErrClosed
		_, _ = server.Close(), client.Close()
		return nil, err
	case <-ctx.Done():
		_, _ = server.Close(), client.Close()
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "gateway" }
