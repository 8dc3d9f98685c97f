// Package cluster runs a Kubernetes control plane on loopback over a given
// store: kube-apiserver, kube-controller-manager, kube-scheduler, and kwok
// playing the kubelets of simulated nodes.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/proc"
)

// Options configure a cluster.
type Options struct {
	Dir         string   // certificates, configuration and logs
	KubeBinDir  string   // kube-apiserver, kube-controller-manager, kube-scheduler
	KwokBin     string   // kwok
	KwokConfig  []byte   // kwok's configuration and stages (KwokConfigFile)
	EtcdServers []string // the store's client URLs
	// NodeLeaseSeconds is the node leases' duration; kwok renews them every
	// quarter of it, as the kubelet does.
	NodeLeaseSeconds int
	// ClientQPS is the controller-manager's and scheduler's client rate
	// (burst twice that), so the control plane keeps up with the churn.
	ClientQPS    int
	ReadyTimeout time.Duration
}

// Cluster is a running control plane.
type Cluster struct {
	URL        string // https://127.0.0.1:port
	Kubeconfig string
	Apiserver  *proc.Proc
	Others     []*proc.Proc // controller-manager, scheduler, kwok
	token      string
	caFile     string
}

// advertiseAddress is TEST-NET-1 (RFC 5737): the lease endpoint reconciler
// refuses loopback addresses; this one only lands in the kubernetes
// Endpoints object and is never dialled.
const advertiseAddress = "192.0.2.1"

// Start starts kube-apiserver, waits until /readyz says ok, then starts the
// controller-manager, the scheduler and kwok.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	p, err := writePKI(o.Dir)
	if err != nil {
		return nil, err
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	c := &Cluster{token: hex.EncodeToString(tok[:]), caFile: p.caCert}
	if err := c.startApiserver(ctx, o, p); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.startOthers(o, p); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startApiserver(ctx context.Context, o Options, p pki) error {
	tokens := filepath.Join(o.Dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.token+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	port, err := proc.FreePort()
	if err != nil {
		return err
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"--etcd-servers=" + strings.Join(o.EtcdServers, ","),
		"--bind-address=127.0.0.1",
		"--advertise-address=" + advertiseAddress,
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		// Room for one Service per Deployment at any profile size.
		"--service-cluster-ip-range=10.96.0.0/16",
		"--v=1",
	}
	c.Apiserver, err = proc.Start("kube-apiserver", filepath.Join(o.KubeBinDir, "kube-apiserver"), args, nil, filepath.Join(o.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(o.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, c.kubeconfig(), 0o600); err != nil {
		return err
	}
	return c.waitReady(ctx, o.ReadyTimeout)
}

func (c *Cluster) kubeconfig() []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: scale
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: scale
  context: {cluster: scale, user: admin}
current-context: scale
`, c.URL, c.caFile, c.token)
}

// Config is a client configuration for the cluster's administrator, with a
// rate limit of qps (burst twice that).
func (c *Cluster) Config(qps int) *rest.Config {
	return &rest.Config{
		Host:            c.URL,
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.caFile},
		QPS:             float32(qps),
		Burst:           2 * qps,
	}
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	cs, err := kubernetes.NewForConfig(c.Config(50))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		if exited, err := c.Apiserver.Exited(); exited {
			return fmt.Errorf("kube-apiserver exited (%v):\n%s", err, c.Apiserver.LogTail(40))
		}
		body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		last = fmt.Sprintf("%v %s", err, body)
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %v: %s\n%s", timeout, last, c.Apiserver.LogTail(40))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) startOthers(o Options, p pki) error {
	kcmPort, err1 := proc.FreePort()
	schedPort, err2 := proc.FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	schedConfig := filepath.Join(o.Dir, "scheduler.yaml")
	if err := os.WriteFile(schedConfig, fmt.Appendf(nil, `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
`, c.Kubeconfig, o.ClientQPS, 2*o.ClientQPS), 0o600); err != nil {
		return err
	}
	kwokConfig := filepath.Join(o.Dir, "kwok.yaml")
	if err := os.WriteFile(kwokConfig, o.KwokConfig, 0o600); err != nil {
		return err
	}
	auth := []string{"--kubeconfig=" + c.Kubeconfig, "--authentication-kubeconfig=" + c.Kubeconfig, "--authorization-kubeconfig=" + c.Kubeconfig}
	specs := []struct {
		name, bin string
		args      []string
	}{
		{"kube-controller-manager", filepath.Join(o.KubeBinDir, "kube-controller-manager"), append(auth,
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(kcmPort),
			"--service-account-private-key-file="+p.saKey, "--root-ca-file="+p.caCert,
			"--use-service-account-credentials=false",
			"--kube-api-qps="+strconv.Itoa(o.ClientQPS), "--kube-api-burst="+strconv.Itoa(2*o.ClientQPS),
			"--v=1")},
		{"kube-scheduler", filepath.Join(o.KubeBinDir, "kube-scheduler"), append(auth[1:],
			"--config="+schedConfig, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(schedPort), "--v=1")},
		{"kwok", o.KwokBin, []string{
			"--kubeconfig=" + c.Kubeconfig, "--config=" + kwokConfig,
			"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=" + NodeAnnotation + "=fake",
			"--node-lease-duration-seconds=" + strconv.Itoa(o.NodeLeaseSeconds),
			// Pod IPs: a /9 holds any profile's pods; kwok serves nothing
			// (no --server-address, no --node-port).
			"--cidr=10.128.0.0/9"}},
	}
	for _, s := range specs {
		pr, err := proc.Start(s.name, s.bin, s.args, nil, filepath.Join(o.Dir, s.name+".log"))
		if err != nil {
			return err
		}
		c.Others = append(c.Others, pr)
	}
	return nil
}

// NodeAnnotation marks the nodes kwok manages.
const NodeAnnotation = "kwok.x-k8s.io/node"

// Alive says which component, if any, has exited.
func (c *Cluster) Alive() error {
	for _, p := range append([]*proc.Proc{c.Apiserver}, c.Others...) {
		if p == nil {
			continue
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited (%v):\n%s", p.Name, err, p.LogTail(40))
		}
	}
	return nil
}

// Stop stops kwok, the scheduler and the controller-manager, then the
// apiserver.
func (c *Cluster) Stop() {
	for i := len(c.Others) - 1; i >= 0; i-- {
		c.Others[i].Stop()
	}
	if c.Apiserver != nil {
		c.Apiserver.Stop()
	}
}
