package server_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/server"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func mustURL(t *testing.T, s string) url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return *u
}

// TestUnixSocketAndHTTPOnlyURLs: a unix:// client URL serves gRPC on a
// socket file (what Kubernetes' integration framework gives etcd), and
// with --listen-client-http-urls the client URLs serve gRPC only and those
// URLs HTTP only, as in etcd. The socket file goes when the server stops.
func TestUnixSocketAndHTTPOnlyURLs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "etcd.sock")
	httpAddr := freeAddr(t)
	cfg := server.Config{Logger: zap.NewNop(),
		ListenClientURLs:     []url.URL{mustURL(t, "unix://"+sock)},
		ListenClientHTTPURLs: []url.URL{mustURL(t, "http://"+httpAddr)},
		AdvertiseClientURLs:  []url.URL{mustURL(t, "http://127.0.0.111:0")},
	}
	srv, err := server.New(cfg, testdb.Open(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + sock}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put over the unix socket: %v", err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	if resp, err := hc.Get("http://" + httpAddr + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health on the HTTP-only URL: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	unixHTTP := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	if resp, err := unixHTTP.Get("http://etcd/health"); err == nil {
		resp.Body.Close()
		t.Fatal("HTTP served on the gRPC-only client URL")
	}
	grpcOnHTTP, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + httpAddr}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = grpcOnHTTP.Get(sctx, "k")
		scancel()
		grpcOnHTTP.Close()
	}
	if err == nil {
		t.Fatal("gRPC served on the HTTP-only URL")
	}
	srv.Stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

// TestHostWhitelistAndCORS: etcd's --host-whitelist refuses plain-HTTP
// requests for other hosts with 421, and --cors answers only the listed
// origins.
func TestHostWhitelistAndCORS(t *testing.T) {
	addr := freeAddr(t)
	cfg := server.Config{Logger: zap.NewNop(),
		ListenClientURLs:    []url.URL{mustURL(t, "http://"+addr)},
		AdvertiseClientURLs: []url.URL{mustURL(t, "http://"+addr)},
		HostWhitelist:       []string{"good.example"},
		CORS:                []string{"http://app.example:80"},
	}
	srv, err := server.New(cfg, testdb.Open(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	get := func(host, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/health", nil)
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := get("evil.example:2379", ""); r.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("host not on the whitelist: %d", r.StatusCode)
	}
	if r := get("good.example:2379", "http://app.example:80"); r.StatusCode != http.StatusOK || r.Header.Get("Access-Control-Allow-Origin") != "http://app.example:80" {
		t.Errorf("listed origin: %d %q", r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
	}
	if r := get("good.example", "http://other.example"); r.StatusCode != http.StatusOK || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("unlisted origin: %d %q", r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
	}
}
