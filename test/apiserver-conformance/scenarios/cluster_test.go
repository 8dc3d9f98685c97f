package scenarios

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

// kubeBinDir is where kube-apiserver, kube-controller-manager and
// kube-scheduler are (set in TestMain).
var kubeBinDir string

// store is the etcd the apiserver runs on: fdb-etcd on its embedded store,
// three fdb-etcd replicas on FoundationDB, or the embedded etcd reference.
type store struct {
	name      string
	reference bool // the embedded etcd
	urls      []string
	client    *clientv3.Client
	stop      func()
	logs      func() string
	// restart stops the servers and starts them again on the same data and
	// ports (fdb-etcd only).
	restart func() error
	// cert, when set, is the client certificate kube-apiserver connects
	// to the store with (a tenant's, tenants_test.go).
	cert *clientCert
}

// Store names, also the columns of the report.
const (
	storeEmbedded = "fdb-etcd"
	storeFDB      = "fdb-etcd-fdb"
	storeEtcd     = "etcd"
)

// fdbCluster is the run's FoundationDB cluster (TestMain), nil when the
// FoundationDB half does not run; every stack on it gets its own keyspace.
var fdbCluster *fdbetcd.FDB

// fdbReplicas is how many fdb-etcd replicas share a keyspace on FoundationDB;
// the apiserver's --etcd-servers names them all.
const fdbReplicas = 3

func startStore(dir, name string) (*store, error) {
	switch name {
	case storeEmbedded:
		return startFDBEtcd(dir)
	case storeFDB:
		return startFDBReplicas(dir)
	default:
		return startEmbeddedEtcd(dir)
	}
}

func startFDBReplicas(dir string) (*store, error) {
	if fdbCluster == nil {
		return nil, fmt.Errorf("no FoundationDB cluster")
	}
	opts := fdbetcd.Options{ProgressNotifyInterval: progressNotifyInterval, DataDir: filepath.Join(dir, "fdb-etcd.data")}
	r, err := fdbetcd.StartReplicas(fdbCluster, fdbReplicas, opts)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: r.URLs(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		r.Stop()
		return nil, err
	}
	var mu sync.Mutex
	return &store{
		name: storeFDB, urls: r.URLs(), client: cli,
		stop: func() {
			cli.Close()
			mu.Lock()
			defer mu.Unlock()
			r.Stop()
		},
		logs: func() string { return r.Logs(1 << 20) },
		restart: func() error {
			mu.Lock()
			defer mu.Unlock()
			return r.Restart()
		},
	}, nil
}

func startFDBEtcd(dir string) (*store, error) {
	opts := fdbetcd.Options{ProgressNotifyInterval: progressNotifyInterval, DataDir: filepath.Join(dir, "fdb-etcd.data"), LogPath: filepath.Join(dir, "fdb-etcd.log")}
	s, err := fdbetcd.Start(opts)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.URL}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.Kill()
		return nil, err
	}
	var mu sync.Mutex
	st := &store{name: storeEmbedded, urls: []string{s.URL}, client: cli}
	st.stop = func() {
		cli.Close()
		mu.Lock()
		defer mu.Unlock()
		s.Stop()
	}
	st.logs = func() string {
		b, _ := os.ReadFile(opts.LogPath)
		return string(b)
	}
	st.restart = func() error {
		mu.Lock()
		defer mu.Unlock()
		s.Stop()
		opts.Port = s.Port
		var err error
		for try := 0; try < 20; try++ { // the port may linger a moment
			var ns *fdbetcd.Server
			if ns, err = fdbetcd.Start(opts); err == nil {
				s = ns
				return nil
			}
			time.Sleep(250 * time.Millisecond)
		}
		return err
	}
	return st, nil
}

// startEmbeddedEtcd starts the reference etcd on two ports that were free a
// moment ago; when another process took one in between (the machine runs
// other tests), it tries again on fresh ports, as fdbetcd.Start does.
func startEmbeddedEtcd(dir string) (*store, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var st *store
		if st, err = startEmbeddedEtcdOnce(dir); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return st, err
		}
		if rmErr := os.RemoveAll(filepath.Join(dir, "etcd.data")); rmErr != nil {
			return nil, rmErr
		}
	}
	return nil, err
}

func startEmbeddedEtcdOnce(dir string) (*store, error) {
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd.data")
	// Durable, as fdb-etcd is: an etcd without fsync would answer its
	// linearizable reads without ever waiting for a commit, and the latency
	// comparison would be with an etcd nobody runs.
	cfg.LogLevel = "error"
	cfg.WatchProgressNotifyInterval = progressNotifyInterval
	p1, err := fdbetcd.FreePort()
	if err != nil {
		return nil, err
	}
	p2, err := fdbetcd.FreePort()
	if err != nil {
		return nil, err
	}
	cu := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(p1)}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(p2)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.Close()
		return nil, err
	}
	return &store{name: storeEtcd, reference: true, urls: []string{cu.String()}, client: cli, stop: func() { cli.Close(); e.Close() }, logs: func() string { return "" }}, nil
}

// proc is a running Kubernetes component.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	once    sync.Once
}

func startProc(name, bin string, args []string, env []string, logPath string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stop(sig syscall.Signal) {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// cluster is a kube-apiserver (and optionally controller-manager and
// scheduler) on one store.
type cluster struct {
	store      *store
	dir        string
	port       int
	token      string
	caFile     string
	saKey      string
	kubeconfig string
	apiserver  *proc
	args, env  []string // kube-apiserver's command line and environment
	kcm, sched *proc
	started    time.Time
	cfg        *rest.Config
	client     kubernetes.Interface
	dyn        dynamic.Interface
}

const (
	// progressNotifyInterval is etcd's --experimental-watch-progress-notify-interval
	// as kubeadm sets it (5s): without periodic progress a quiet resource's
	// watch cache lags, and with the short compaction interval below the
	// apiserver's consistency checker could not list storage at its RV.
	progressNotifyInterval = 5 * time.Second
	advertiseAddress       = "192.0.2.1"
	compactionInterval     = 30 * time.Second
	eventTTL               = 20 * time.Second
)

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// genCerts writes a CA, a serving certificate for 127.0.0.1/localhost and
// the service-account key pair.
func genCerts(dir string) (ca, crt, key, saKey, saPub string, err error) {
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "conformance-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return
	}
	ca, crt, key = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	saKey, saPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	for _, w := range []struct {
		p, t string
		d    []byte
	}{
		{ca, "CERTIFICATE", caDER},
		{crt, "CERTIFICATE", srvDER},
		{key, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(srvKey)},
		{saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)},
		{saPub, "PUBLIC KEY", saPubDER},
	} {
		if err = writePEM(w.p, w.t, w.d); err != nil {
			return
		}
	}
	return
}

// startCluster starts kube-apiserver on st. The apiserver runs with the
// watch-cache consistency checker on (KUBE_WATCHCACHE_CONSISTENCY_CHECKER).
func startCluster(t testing.TB, st *store, dir string) (*cluster, error) {
	ca, crt, key, saKey, saPub, err := genCerts(dir)
	if err != nil {
		return nil, err
	}
	token := "conformance-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}
	port, err := fdbetcd.FreePort()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--etcd-servers=" + strings.Join(st.urls, ","),
		"--bind-address=127.0.0.1",
		// The lease endpoint reconciler (which writes /registry/masterleases/)
		// refuses loopback addresses; 192.0.2.1 (TEST-NET-1, RFC 5737) only
		// ends up in the kubernetes Endpoints object and is never dialed.
		"--advertise-address=" + advertiseAddress,
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + crt,
		"--tls-private-key-file=" + key,
		"--client-ca-file=" + ca,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--etcd-compaction-interval=" + compactionInterval.String(),
		"--event-ttl=" + eventTTL.String(),
		"--profiling=false",
		"--v=2",
	}
	if st.cert != nil {
		args = append(args, "--etcd-cafile="+st.cert.caFile, "--etcd-certfile="+st.cert.certFile, "--etcd-keyfile="+st.cert.keyFile)
	}
	env := []string{"KUBE_WATCHCACHE_CONSISTENCY_CHECKER=true"}
	c := &cluster{store: st, dir: dir, port: port, token: token, caFile: ca, saKey: saKey, args: args, env: env}
	c.cfg = &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		QPS:             1000,
		Burst:           2000,
	}
	if c.client, err = kubernetes.NewForConfig(c.cfg); err != nil {
		return nil, err
	}
	if c.dyn, err = dynamic.NewForConfig(c.cfg); err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: c
  context: {cluster: c, user: admin}
current-context: c
`, port, ca, token)
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		return nil, err
	}
	return c, c.startAPIServer(t)
}

// startAPIServer starts kube-apiserver with c.args and c.env (again, after
// a stop: same port, certificates and log file) and waits until it is ready.
func (c *cluster) startAPIServer(t testing.TB) error {
	p, err := startProc("kube-apiserver", filepath.Join(kubeBinDir, "kube-apiserver"), c.args, c.env, filepath.Join(c.dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	c.apiserver, c.started = p, time.Now()
	return c.waitReady(t)
}

// waitReady waits (three minutes at most) until kube-apiserver answers
// /readyz with ok.
func (c *cluster) waitReady(t testing.TB) error {
	p := c.apiserver
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	for {
		if p.exited() {
			return fmt.Errorf("kube-apiserver exited: %v\n%s", p.err, tail(p.log(), 4000))
		}
		body, err := c.client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %v: %v %s", time.Since(start), err, body)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("kube-apiserver on %s ready in %v (https://127.0.0.1:%d)", c.store.name, time.Since(start).Round(time.Millisecond), c.port)
	return nil
}

// startControlPlane adds kube-controller-manager and kube-scheduler.
func (c *cluster) startControlPlane() error {
	kp, err := fdbetcd.FreePort()
	if err != nil {
		return err
	}
	sp, err := fdbetcd.FreePort()
	if err != nil {
		return err
	}
	c.kcm, err = startProc("kube-controller-manager", filepath.Join(kubeBinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kp),
		"--service-account-private-key-file=" + c.saKey,
		"--root-ca-file=" + c.caFile,
		"--use-service-account-credentials=false",
		"--v=2",
	}, nil, filepath.Join(c.dir, "kube-controller-manager.log"))
	if err != nil {
		return err
	}
	c.sched, err = startProc("kube-scheduler", filepath.Join(kubeBinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + c.kubeconfig,
		"--authentication-kubeconfig=" + c.kubeconfig,
		"--authorization-kubeconfig=" + c.kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(sp),
		"--v=2",
	}, nil, filepath.Join(c.dir, "kube-scheduler.log"))
	return err
}

func (c *cluster) stop() {
	for _, p := range []*proc{c.sched, c.kcm, c.apiserver} {
		if p != nil {
			p.stop(syscall.SIGTERM)
		}
	}
}

// metrics returns the apiserver's /metrics text.
func (c *cluster) metrics(ctx context.Context) (string, error) {
	b, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(b), err
}

// metricSum adds up the samples of a metric whose labels contain every
// given label="value" pair.
func metricSum(text, name string, labels ...string) float64 {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
