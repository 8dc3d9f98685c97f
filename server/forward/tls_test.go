package forward_test

import (
	"crypto/tls"
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/forward"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig/tlstest"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

func startTLS(t *testing.T, db storage.DB, name string, files tlstest.Files) (*server.Server, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "https", Host: l.Addr().String()}
	srv, err := server.New(server.Config{
		Name:                name,
		ListenClientURLs:    []url.URL{u},
		AdvertiseClientURLs: []url.URL{u},
		TLS:                 tlsconfig.Config{CertFile: files.Cert, KeyFile: files.Key, TrustedCAFile: files.CA, ClientCertAuth: true, ReloadInterval: -1},
		Logger:              zap.NewNop(),
		ForwardWrites:       true,
		Forward:             forward.Config{TTL: time.Second},
	}, shared{db})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ServeTLSListener(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv, u.String()
}

// TestForwardOverMutualTLS: with --client-cert-auth, a replica reaches the
// owner with its own certificate as the client certificate, as the deploy/
// manifests expect (the server certificate carries client auth).
func TestForwardOverMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "etcd-ca")
	db := testdb.Open(t)
	_, _ = startTLS(t, db, "a", tlstest.Write(t, t.TempDir(), ca.Server(t, "a"), ca))
	b, bURL := startTLS(t, db, "b", tlstest.Write(t, t.TempDir(), ca.Server(t, "b"), ca))
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{bURL},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Client(t, "kube-apiserver").TLS(t)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c := ctx(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := cli.Put(c, "k", "v"); err != nil {
			t.Fatal(err)
		}
		text := string(scrapeHandler(t, b))
		if metricAtLeastOne(text, `fdb_etcd_forward_writes_total{result="ok"}`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never forwarded a write to a over mutual TLS; metrics:\n%s", grep(text, "fdb_etcd_forward"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
