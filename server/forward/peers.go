package forward

import (
	"crypto/tls"
	"errors"
	"math"
	"net/url"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Peers keeps one gRPC connection per owner URL.
type Peers struct {
	// tls returns the client TLS configuration for https owners (this
	// replica's certificate and the trusted CA); nil when TLS is off.
	tls func() *tls.Config

	mu    sync.Mutex
	conns map[string]peer
}

type peer struct {
	cc *grpc.ClientConn
	kv pb.KVClient
}

// NewPeers returns an empty connection set; tlsConfig may be nil.
func NewPeers(tlsConfig func() *tls.Config) *Peers {
	return &Peers{tls: tlsConfig, conns: map[string]peer{}}
}

// ready returns a KV client for the replica at rawURL if its connection is
// up, and otherwise starts connecting and returns nil.
func (p *Peers) ready(rawURL string) pb.KVClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.conns[rawURL]
	if !ok {
		cc, err := p.dial(rawURL)
		if err != nil {
			return nil
		}
		pr = peer{cc: cc, kv: pb.NewKVClient(cc)}
		p.conns[rawURL] = pr
	}
	if pr.cc.GetState() != connectivity.Ready {
		pr.cc.Connect()
		return nil
	}
	return pr.kv
}

func (p *Peers) dial(rawURL string) (*grpc.ClientConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		var tc *tls.Config
		if p.tls != nil {
			tc = p.tls()
		}
		if tc == nil {
			return nil, errors.New("forward: https owner but no client TLS configuration")
		}
		creds = credentials.NewTLS(tc)
	}
	return grpc.NewClient("passthrough:///"+u.Host,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
}

// Close closes every connection.
func (p *Peers) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, pr := range p.conns {
		_ = pr.cc.Close()
		delete(p.conns, k)
	}
}

// isEtcdError reports whether err is an answer from etcd's API (an error
// etcd itself sends, such as compacted or request too large) rather than a
// transport failure on the way.
func isEtcdError(err error) bool {
	_, known := rpctypes.Error(err).(rpctypes.EtcdError)
	return known
}
