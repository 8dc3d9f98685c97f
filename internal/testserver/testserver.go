// Package testserver starts a real fdb-etcd server on loopback for tests:
// real gRPC, the store testdb gives (Pebble in a temp dir, or FoundationDB), and a
// real clientv3.
package testserver

import (
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Server is a running test server.
type Server struct {
	*server.Server
	Addr   string
	Client *clientv3.Client
}

// Options adjust the server; the zero value is the store testdb.Open gives.
type Options struct {
	DB     storage.DB
	Config server.Config
}

// Start starts a server and a client; both stop when the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	db := o.DB
	if db == nil {
		db = testdb.Open(t)
	}
	cfg := o.Config
	if testdb.Backend() == "pebble" {
		cfg.MVCC.SoleWriter = true // a Pebble store is locked to one server
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "http", Host: l.Addr().String()}
	cfg.ListenClientURLs = []url.URL{u}
	cfg.AdvertiseClientURLs = []url.URL{u}
	srv, err := server.New(cfg, db)
	if err != nil {
		t.Fatal(err)
	}
	srv.ServeListener(l)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{u.String()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	ts := &Server{Server: srv, Addr: u.String(), Client: cli}
	t.Cleanup(func() {
		_ = cli.Close()
		srv.Stop()
	})
	return ts
}
