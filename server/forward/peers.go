package forward

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Peers keeps one gRPC connection per owner URL.
type Peers struct {
	// tls returns the client TLS configuration for https owners (this
	// replica's certificate and the trusted CAs as they are now); nil when
	// TLS is off.
	tls func() *tls.Config
	lg  *zap.Logger

	mu     sync.Mutex
	conns  map[string]peer // guarded by mu
	closed bool            // guarded by mu: Close ran; dial no more
}

type peer struct {
	url   string
	cc    *grpc.ClientConn
	kv    pb.KVClient
	lease pb.LeaseClient
	// down is set while the connection has failed since it was last up:
	// the owner's log need not say why (a refused client certificate
	// leaves no trace there), so this replica says when it starts and
	// stops committing its writes itself, once each time.
	down *atomic.Bool
}

// NewPeers returns an empty connection set; tlsConfig and lg may be nil.
// It warns at once when the certificate this replica presents to the
// others cannot pass their client verification: every write it receives
// would then be committed here instead of at the owner, which works but
// conflicts with the owner's commits on the head revision and under load
// times out, looking like a slow cluster rather than a refused one.
func NewPeers(tlsConfig func() *tls.Config, lg *zap.Logger) *Peers {
	if lg == nil {
		lg = zap.NewNop()
	}
	if err := clientCertUsable(tlsConfig); err != nil {
		lg.Warn("other replicas will refuse this replica's certificate, so the writes it receives are committed here "+
			"instead of at the write owner; issue it with the clientAuth extended key usage, or give --client-cert-file one that has it",
			zap.Error(err))
	}
	return &Peers{tls: tlsConfig, lg: lg, conns: map[string]peer{}}
}

// ready returns the connection to the replica at rawURL once it is up. A
// connection still being made (a replica's first write, or the first after
// ownership moved) is waited for, up to connectWait: committing here
// instead would race the owner's stream of commits on the head revision,
// and under load it loses every race until its deadline. One that failed
// (the owner is unreachable) is not: the write commits here.
func (p *Peers) ready(ctx context.Context, rawURL string) (peer, bool) {
	pr, ok := p.conn(rawURL)
	if !ok {
		return peer{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	for {
		st := pr.cc.GetState()
		switch st {
		case connectivity.Ready:
			if pr.down.CompareAndSwap(true, false) {
				p.lg.Info("write owner reachable again: forwarding writes to it", zap.String("owner", pr.url))
			}
			return pr, true
		case connectivity.TransientFailure:
			if pr.down.CompareAndSwap(false, true) {
				p.logUnreachable(ctx, pr)
			}
			fallthrough
		case connectivity.Shutdown:
			pr.cc.Connect() // try again, for the next write
			return peer{}, false
		case connectivity.Idle:
			pr.cc.Connect()
		}
		if !pr.cc.WaitForStateChange(ctx, st) {
			return peer{}, false
		}
	}
}

// logUnreachable says once that writes to the owner are committed here,
// and why. gRPC's last connection error is the owner's TLS alert only when
// it arrived before this replica wrote on the connection: with TLS 1.3 the
// client's handshake ends before the owner has checked its certificate, and
// the owner's reset often discards the alert, leaving a "broken pipe". So
// when this replica's own certificate is the likely cause, the log names it
// whatever gRPC saw.
func (p *Peers) logUnreachable(ctx context.Context, pr peer) {
	fields := []zap.Field{zap.String("owner", pr.url), zap.Error(lastConnError(ctx, pr.cc))}
	if err := clientCertUsable(p.tls); err != nil {
		fields = append(fields, zap.NamedError("certificate", err))
	}
	p.lg.Warn("cannot connect to the write owner: committing writes here until it can be reached "+
		"(check that its certificate is trusted here and that it accepts this replica's as a client's)", fields...)
}

// lastConnError is why the connection to an owner failed, as gRPC knows
// it: a fail-fast call on a connection in TransientFailure returns at once,
// without sending anything, with the last connection error (a dial
// refused, a handshake failed, the owner refusing this replica's
// certificate) in its message. nil if the connection came up meanwhile and
// the call, a Status, succeeded.
func lastConnError(ctx context.Context, cc *grpc.ClientConn) error {
	_, err := pb.NewMaintenanceClient(cc).Status(ctx, &pb.StatusRequest{})
	return err
}

// connectWait bounds how long a write waits for the connection to the
// owner to come up; on loopback or a LAN it takes milliseconds.
const connectWait = time.Second

// Conn returns the connection to the replica at rawURL, dialing it
// (without waiting) the first time: other streams to the owner, such as
// the commit feed, share the forwarded writes' connection.
func (p *Peers) Conn(rawURL string) (grpc.ClientConnInterface, bool) {
	pr, ok := p.conn(rawURL)
	if !ok {
		return nil, false
	}
	return pr.cc, true
}

// isReady reports whether the connection to rawURL exists and is up,
// without dialing or waiting.
func (p *Peers) isReady(rawURL string) bool {
	p.mu.Lock()
	pr, ok := p.conns[rawURL]
	p.mu.Unlock()
	return ok && pr.cc.GetState() == connectivity.Ready
}

// reconnect starts connecting to rawURL, dialing it the first time, unless
// its connection is up; it does not wait. A connection stays idle until
// something asks for it: a new one, and one that dropped.
func (p *Peers) reconnect(rawURL string) {
	if pr, ok := p.conn(rawURL); ok && pr.cc.GetState() != connectivity.Ready {
		pr.cc.Connect()
	}
}

// conn returns the connection to rawURL, dialing it (without waiting) the
// first time.
func (p *Peers) conn(rawURL string) (peer, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return peer{}, false
	}
	pr, ok := p.conns[rawURL]
	if !ok {
		cc, err := p.dial(rawURL)
		if err != nil {
			return peer{}, false
		}
		pr = peer{url: rawURL, cc: cc, kv: pb.NewKVClient(cc), lease: pb.NewLeaseClient(cc), down: new(atomic.Bool)}
		p.conns[rawURL] = pr
	}
	return pr, true
}

func (p *Peers) dial(rawURL string) (*grpc.ClientConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		if p.tls == nil || p.tls() == nil {
			return nil, errors.New("forward: https owner but no client TLS configuration")
		}
		creds = reloadingTLS{config: p.tls}
	}
	return grpc.NewClient("passthrough:///"+u.Host,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
}

// Close closes every connection; requests after it run locally.
func (p *Peers) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for k, pr := range p.conns {
		_ = pr.cc.Close()
		delete(p.conns, k)
	}
}

// reloadingTLS is client transport credentials that take the TLS
// configuration afresh for every handshake. A connection lives for many
// handshakes (it reconnects after every failure), and the trusted CAs and
// this replica's certificate may have been rotated in between: a
// configuration captured once would keep trusting the old CA only.
type reloadingTLS struct{ config func() *tls.Config }

var (
	errClientOnly = errors.New("forward: client-side credentials")
	errNoOverride = errors.New("forward: the server name is the owner URL's host")
)

func (c reloadingTLS) current() credentials.TransportCredentials {
	return credentials.NewTLS(c.config())
}

// ClientHandshake verifies the server with the CAs trusted now.
func (c reloadingTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

// ServerHandshake is not for clients.
func (reloadingTLS) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errClientOnly
}

// Info describes TLS.
func (c reloadingTLS) Info() credentials.ProtocolInfo { return c.current().Info() }

// Clone shares the configuration source, which is safe for concurrent use.
func (c reloadingTLS) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is deprecated in gRPC; the name comes from the URL.
func (reloadingTLS) OverrideServerName(string) error { return errNoOverride }

// clientCertUsable returns why the certificate config presents as a
// client would fail another replica's verification (Go's, as gRPC servers
// verify clients), or nil: one that lists extended key usages must allow
// client authentication among them. A server certificate issued for
// serverAuth alone is the usual case.
func clientCertUsable(config func() *tls.Config) error {
	if config == nil {
		return nil
	}
	cfg := config()
	if cfg == nil {
		return nil
	}
	var cert *tls.Certificate
	switch {
	case cfg.GetClientCertificate != nil:
		c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			return err
		}
		cert = c
	case len(cfg.Certificates) > 0:
		cert = &cfg.Certificates[0]
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return err
		}
	}
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return nil // no restriction
	}
	for _, u := range leaf.ExtKeyUsage {
		if u == x509.ExtKeyUsageClientAuth || u == x509.ExtKeyUsageAny {
			return nil
		}
	}
	return fmt.Errorf("certificate %q: its extended key usage does not include clientAuth", leaf.Subject.CommonName)
}

// isEtcdError reports whether err is an answer from etcd's API (an error
// etcd itself sends, such as compacted or request too large) rather than a
// transport failure on the way.
func isEtcdError(err error) bool {
	_, known := rpctypes.Error(err).(rpctypes.EtcdError)
	return known
}
