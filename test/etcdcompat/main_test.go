package etcdcompat

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Environment variables understood by the harness.
const (
	// envCandidate selects the server under test: "fdb-etcd" (default) builds
	// and runs ../../cmd/fdb-etcd; "etcd" runs a second embedded etcd, which
	// is useful to self-test the harness (every test must then pass).
	envCandidate = "ETCDCOMPAT_CANDIDATE"
	// envBinary names a prebuilt fdb-etcd binary; when set, nothing is built.
	envBinary = "ETCDCOMPAT_BINARY"
	// envExtraArgs holds extra whitespace-separated arguments for fdb-etcd.
	envExtraArgs = "ETCDCOMPAT_FDB_ARGS"
	// envBackend "fdb" runs fdb-etcd (built with -tags fdb) on the
	// FoundationDB cluster in FDB_CLUSTER_FILE, each server in a fresh
	// keyspace (--fdb-prefix) that is left behind: the cluster is a
	// throwaway one.
	envBackend = "ETCDCOMPAT_BACKEND"
)

var (
	flagSeed = flag.Int64("seed", 0, "run the randomised KV sequences with only this seed (0: the fixed default seeds)")
	flagOps  = flag.Int("ops", 0, "operations per randomised sequence (0: default)")
)

// Set up by TestMain.
var (
	candidateKind string // "etcd" or "fdb-etcd"
	fdbBinary     string // path of the fdb-etcd binary when candidateKind == "fdb-etcd"
	fdbBuildErr   error  // why the binary is unavailable
	fdbCluster    string // cluster file when fdb-etcd runs on FoundationDB
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		candidateKind = os.Getenv(envCandidate)
		switch candidateKind {
		case "", "fdb-etcd", "fdbetcd":
			candidateKind = "fdb-etcd"
		case "etcd":
		default:
			fmt.Fprintf(os.Stderr, "etcdcompat: unknown %s=%q (want \"etcd\" or \"fdb-etcd\")\n", envCandidate, candidateKind)
			return 2
		}
		tmp, err := os.MkdirTemp("", "etcdcompat-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "etcdcompat:", err)
			return 2
		}
		defer os.RemoveAll(tmp)
		if candidateKind == "fdb-etcd" && os.Getenv(envBackend) == "fdb" {
			cf := os.Getenv("FDB_CLUSTER_FILE")
			if _, err := os.Stat(cf); cf == "" || err != nil {
				fmt.Fprintf(os.Stderr, "etcdcompat: %s=fdb needs FDB_CLUSTER_FILE naming a cluster file (make test-fdb starts a throwaway fdbserver): %v\n", envBackend, err)
				return 2
			}
			fdbCluster = cf
			fmt.Fprintf(os.Stderr, "etcdcompat: fdb-etcd runs on FoundationDB, cluster file %s\n", cf)
		}
		if code := setupTenantMode(tmp); code != 0 {
			return code
		}
		if candidateKind == "fdb-etcd" {
			fdbBinary, fdbBuildErr = buildFDBEtcd(tmp)
			if fdbBuildErr != nil {
				fmt.Fprintf(os.Stderr, "etcdcompat: fdb-etcd binary unavailable, every test will fail:\n%v\n", fdbBuildErr)
			} else {
				fmt.Fprintf(os.Stderr, "etcdcompat: candidate is fdb-etcd binary %s\n", fdbBinary)
			}
		} else {
			fmt.Fprintf(os.Stderr, "etcdcompat: candidate is a second embedded etcd (%s=etcd, harness self-test)\n", envCandidate)
		}
		defer removeEtcd35()
		return m.Run()
	}()
	os.Exit(code)
}

// setupTenantMode makes the certificates of tenant mode (envTenant=1) in
// dir; it returns a non-zero exit code when the mode cannot run.
func setupTenantMode(dir string) int {
	switch os.Getenv(envTenant) {
	case "", "0":
		return 0
	case "1":
	default:
		fmt.Fprintf(os.Stderr, "etcdcompat: unknown %s=%q (want 1 or 0)\n", envTenant, os.Getenv(envTenant))
		return 2
	}
	if candidateKind != "fdb-etcd" {
		fmt.Fprintf(os.Stderr, "etcdcompat: %s=1 needs the fdb-etcd candidate: etcd has no tenants\n", envTenant)
		return 2
	}
	p, err := newPKI(dir, compatTenant, neighbourTenant)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdcompat: tenant certificates:", err)
		return 2
	}
	tenantPKI = p
	fmt.Fprintf(os.Stderr, "etcdcompat: fdb-etcd serves tenants by client certificate; the tests are tenant %q, tenant %q writes beside them\n", compatTenant, neighbourTenant)
	return 0
}

// buildFDBEtcd builds ./cmd/fdb-etcd of the repository root (../..) into dir.
func buildFDBEtcd(dir string) (string, error) {
	if b := os.Getenv(envBinary); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("%s=%s: %w", envBinary, b, err)
		}
		return b, nil
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "fdb-etcd")
	build := []string{"build", "-o", out}
	if fdbCluster != "" {
		build = append(build, "-tags", "fdb")
	}
	cmd := exec.Command(goBin, append(build, "./cmd/fdb-etcd")...)
	cmd.Dir = root
	if fdbCluster != "" {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("(cd %s && go %s) failed: %v\n%s", root, strings.Join(cmd.Args[1:], " "), err, buf.String())
	}
	fmt.Fprintf(os.Stderr, "etcdcompat: built fdb-etcd in %v\n", time.Since(start).Round(time.Millisecond))
	return out, nil
}

// server is one running etcd-compatible endpoint with raw gRPC stubs.
type server struct {
	name     string // "etcd" (reference) or the candidate's name
	endpoint string // host:port
	url      string // advertised client URL
	conn     *grpc.ClientConn
	kv       pb.KVClient
	watch    pb.WatchClient
	lease    pb.LeaseClient
	maint    pb.MaintenanceClient
	cluster  pb.ClusterClient
	cli      *clientv3.Client
	http     *http.Client // for the JSON gateway and the HTTP endpoints of the client port
	tls      *tls.Config  // the client's TLS (tenant mode), nil for plain http
	logPath  string       // fdb-etcd only
}

// pair is a reference etcd and a candidate, both freshly started.
type pair struct {
	ref, cand *server
}

const memberName = "compat"

// pairOptions configure both servers of a pair alike.
type pairOptions struct {
	// quotaBytes is --quota-backend-bytes (0: etcd's default).
	quotaBytes int64
	// store, when set, is the store fdb-etcd serves instead of a fresh one.
	store *candStore
	// etcdDir, when set, is the data directory an embedded etcd starts on
	// instead of a fresh one.
	etcdDir string
}

// startPair starts a fresh reference etcd and a fresh candidate, in parallel.
func startPair(t *testing.T) *pair {
	t.Helper()
	return startPairWith(t, pairOptions{})
}

// startPairWith starts a pair configured by o.
func startPairWith(t *testing.T, o pairOptions) *pair {
	t.Helper()
	if candidateKind == "fdb-etcd" && fdbBuildErr != nil {
		t.Fatalf("fdb-etcd is not available (a missing or broken binary is a failure, not a skip):\n%v", fdbBuildErr)
	}
	var ref, cand *server
	for attempt := 1; ; attempt++ {
		var err error
		ref, cand, err = tryStartPair(t, o)
		if err == nil {
			break
		}
		if attempt < 3 && strings.Contains(err.Error(), "address already in use") {
			t.Logf("retrying server start: %v", err)
			continue
		}
		t.Fatal(err)
	}
	if tenantPKI != nil {
		// After the candidate's cleanup, so it runs first: the neighbour
		// stops while the server still serves it.
		startNeighbour(t, cand.endpoint)
	}
	return &pair{ref: ref, cand: cand}
}

// tryStartPair starts both servers in parallel on distinct ports.
func tryStartPair(t *testing.T, o pairOptions) (ref, cand *server, err error) {
	ports, err := freePorts(t, 4)
	if err != nil {
		return nil, nil, err
	}
	var (
		wg                sync.WaitGroup
		refErr, candErr   error
		refStop, candStop func()
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		ref, refStop, refErr = startEmbedded(t, "etcd", ports[0], ports[1], o)
	}()
	go func() {
		defer wg.Done()
		if candidateKind == "etcd" {
			cand, candStop, candErr = startEmbedded(t, "etcd(candidate)", ports[2], ports[3], o)
		} else {
			cand, candStop, candErr = startFDBEtcd(t, ports[2], o)
		}
	}()
	wg.Wait()
	if refErr != nil || candErr != nil {
		if refStop != nil {
			refStop()
		}
		if candStop != nil {
			candStop()
		}
		if refErr != nil {
			return nil, nil, fmt.Errorf("starting reference etcd: %w", refErr)
		}
		return nil, nil, fmt.Errorf("starting candidate %s: %w", candidateKind, candErr)
	}
	t.Cleanup(refStop)
	t.Cleanup(candStop)
	// Guard against comparing a server with itself.
	ctx, cancel := ctxOp()
	defer cancel()
	if rs, err := ref.maint.Status(ctx, &pb.StatusRequest{}); err == nil {
		if cs, err := cand.maint.Status(ctx, &pb.StatusRequest{}); err == nil && cs.Header.GetMemberId() == rs.Header.GetMemberId() {
			return nil, nil, fmt.Errorf("the candidate at %s answers with the reference's member ID %x", cand.endpoint, rs.Header.GetMemberId())
		}
	}
	return ref, cand, nil
}

func startEmbedded(t *testing.T, name string, cport, pport int, o pairOptions) (*server, func(), error) {
	dir := o.etcdDir
	if dir == "" {
		dir = t.TempDir()
	}
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg := embed.NewConfig()
	cfg.Name = memberName
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{curl}
	cfg.AdvertiseClientUrls = []url.URL{curl}
	cfg.ListenPeerUrls = []url.URL{purl}
	cfg.AdvertisePeerUrls = []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = o.quotaBytes
	// MaxTxnOps, MaxRequestBytes and everything else keep etcd's defaults.
	e, err := startEtcdOnReservedPorts(cfg)
	if err != nil {
		return nil, nil, err
	}
	stop := func() { e.Close() }
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		stop()
		return nil, nil, fmt.Errorf("embedded etcd failed: %v", err)
	case <-time.After(30 * time.Second):
		stop()
		return nil, nil, errors.New("embedded etcd not ready after 30s")
	}
	s, err := dialServer(name, curl.Host, nil)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return s, func() { s.close(); stop() }, nil
}

// startEtcdOnReservedPorts starts an embedded etcd on ports that freePorts
// reserved. No test of this package draws them meanwhile, so whatever holds
// one is brief: the test's own etcd, stopped a moment ago on the same ports,
// or a connection of some other process that had it as its source port.
// CI's FoundationDB run once failed the import test's reference etcd with
// "bind: address already in use"; the port is tried again for a while
// rather than failing the test.
func startEtcdOnReservedPorts(cfg *embed.Config) (*embed.Etcd, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := embed.StartEtcd(cfg)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return e, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func startFDBEtcd(t *testing.T, port int, o pairOptions) (*server, func(), error) {
	store := o.store
	if store == nil {
		store = newCandStore(t)
	}
	logDir := t.TempDir()
	scheme, clientTLS := "http", (*tls.Config)(nil)
	if tenantPKI != nil {
		scheme, clientTLS = "https", tenantPKI.clientTLS(compatTenant)
	}
	u := fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	args := []string{"--name", memberName, "--listen-client-urls", u, "--advertise-client-urls", u}
	args = append(args, store.args()...)
	if tenantPKI != nil {
		args = append(args, tenantPKI.serverArgs()...)
	}
	if o.quotaBytes != 0 {
		args = append(args, "--quota-backend-bytes", fmt.Sprint(o.quotaBytes))
	}
	args = append(args, strings.Fields(os.Getenv(envExtraArgs))...)
	logPath := filepath.Join(logDir, "fdb-etcd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(fdbBinary, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("start %s: %w", fdbBinary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	kill := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			logf.Close()
		})
	}
	fail := func(err error) (*server, func(), error) {
		kill()
		return nil, nil, fmt.Errorf("%v\ncommand: %s %s\nlog tail:\n%s", err, fdbBinary, strings.Join(args, " "), tailFile(logPath, 4000))
	}
	s, err := dialServer("fdb-etcd", fmt.Sprintf("127.0.0.1:%d", port), clientTLS)
	if err != nil {
		return fail(err)
	}
	s.logPath = logPath
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			s.close()
			return fail(fmt.Errorf("fdb-etcd exited early: %v", err))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.kv.Range(ctx, &pb.RangeRequest{Key: []byte("\x00"), RangeEnd: []byte("\x00"), CountOnly: true})
		cancel()
		if err == nil {
			// make sure it was fdb-etcd that answered
			time.Sleep(20 * time.Millisecond)
			select {
			case err := <-exited:
				exited <- err
				s.close()
				return fail(fmt.Errorf("fdb-etcd exited early: %v", err))
			default:
			}
			break
		}
		if time.Now().After(deadline) {
			s.close()
			return fail(fmt.Errorf("fdb-etcd not serving Range after 30s: %v", err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, func() {
		s.close()
		kill()
		if t.Failed() {
			t.Logf("fdb-etcd log tail (%s):\n%s", logPath, tailFile(logPath, 3000))
		}
	}, nil
}

// candStore is where an fdb-etcd keeps its data: an embedded data
// directory, or a fresh keyspace of the FoundationDB cluster under test.
type candStore struct {
	dataDir, fdbPrefix string
}

func newCandStore(t *testing.T) *candStore {
	s := &candStore{dataDir: t.TempDir()}
	if fdbCluster != "" {
		var id [8]byte
		_, _ = crand.Read(id[:])
		s.fdbPrefix = "etcdcompat/" + hex.EncodeToString(id[:])
	}
	return s
}

// args are fdb-etcd's flags naming the store.
func (s *candStore) args() []string {
	if s.fdbPrefix == "" {
		return []string{"--data-dir", s.dataDir}
	}
	return []string{"--data-dir", s.dataDir, "--backend", "fdb", "--fdb-cluster-file", fdbCluster, "--fdb-prefix", s.fdbPrefix}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// dialServer connects to hostport, over TLS with tlsCfg when it is set.
// quickRedial retries a refused connection within 20-200 ms instead of gRPC's
// default backoff (1 s first): a server a test just started refuses its
// first connections, and every test, and each command line of
// TestCommandLineMatchesEtcd, would otherwise wait out that second.
var quickRedial = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
	MinConnectTimeout: 5 * time.Second,
})

func dialServer(name, hostport string, tlsCfg *tls.Config) (*server, error) {
	creds, scheme := insecure.NewCredentials(), "http"
	hc := &http.Client{Timeout: 30 * time.Second}
	if tlsCfg != nil {
		creds, scheme = credentials.NewTLS(tlsCfg), "https"
		hc.Transport = &http.Transport{TLSClientConfig: tlsCfg}
	}
	conn, err := grpc.NewClient(hostport, quickRedial,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{scheme + "://" + hostport},
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{quickRedial},
		TLS:         tlsCfg,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &server{
		name:     name,
		endpoint: hostport,
		url:      scheme + "://" + hostport,
		conn:     conn,
		kv:       pb.NewKVClient(conn),
		watch:    pb.NewWatchClient(conn),
		lease:    pb.NewLeaseClient(conn),
		maint:    pb.NewMaintenanceClient(conn),
		cluster:  pb.NewClusterClient(conn),
		cli:      cli,
		http:     hc,
		tls:      tlsCfg,
	}, nil
}

func (s *server) close() {
	s.cli.Close()
	s.conn.Close()
	s.http.CloseIdleConnections()
}

// opTimeout bounds each unary call.
const opTimeout = 5 * time.Second

func ctxOp() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}
