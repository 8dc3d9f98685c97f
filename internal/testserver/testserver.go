// Package testserver starts a real fdb-etcd server on loopback for tests:
// real gRPC, a real Pebble store in a temp dir (or any storage.DB), and a
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

	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/pebble"
)

// Server is a running test server.
type Server struct {
	*server.Server
	Addr   string
	Client *clientv3.Client
}

// Options adjust the server; the zero value is a Pebble store in t.TempDir().
type Options struct {
	DB     storage.DB
	Config server.Config
}

// Start starts a server and a client; both stop when the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	db := o.DB
	if db == nil {
		var err error
		db, err = pebble.Open(t.TempDir(), pebble.Options{})
		if err != nil {
			t.Fatal(err)
		}
	}
	cfg := o.Config
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
