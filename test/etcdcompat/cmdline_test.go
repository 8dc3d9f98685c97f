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
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The command line of etcd 3.6 against fdb-etcd's: the same arguments,
// environment and config files given to the etcd binary (built from this
// module's go.etcd.io/etcd/server/v3 tool) and to fdb-etcd must be
// accepted by both, or refused by both with the same exit status.

var (
	etcdBinOnce sync.Once
	etcdBinPath string
	etcdBinErr  error
)

// etcdBinary builds the etcd 3.6 binary once per run.
func etcdBinary(t *testing.T) string {
	t.Helper()
	etcdBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "etcdcompat-etcd-")
		if err != nil {
			etcdBinErr = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		etcdBinPath = filepath.Join(dir, "etcd")
		out, err := exec.Command(goBin, "build", "-o", etcdBinPath, "go.etcd.io/etcd/server/v3").CombinedOutput()
		if err != nil {
			etcdBinErr = fmt.Errorf("go build go.etcd.io/etcd/server/v3: %v\n%s", err, out)
		}
	})
	if etcdBinErr != nil {
		t.Fatal(etcdBinErr)
	}
	return etcdBinPath
}

func candidateBinary(t *testing.T) string {
	t.Helper()
	if candidateKind != "fdb-etcd" {
		t.Skip("the command line is fdb-etcd's")
	}
	if fdbBuildErr != nil {
		t.Fatalf("fdb-etcd unavailable: %v", fdbBuildErr)
	}
	return fdbBinary
}

// slots are the addresses and paths one process of a case may use.
type slots struct {
	data, sock, dir string
	c, p, h         string // client, peer and HTTP-only host:port
}

func newSlots(t *testing.T) slots {
	t.Helper()
	ports, err := freePorts(t, 3)
	if err != nil {
		t.Fatal(err)
	}
	// A short directory: a unix socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "cl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return slots{data: filepath.Join(dir, "data"), sock: filepath.Join(dir, "etcd.sock"), dir: dir,
		c: fmt.Sprintf("127.0.0.1:%d", ports[0]), p: fmt.Sprintf("127.0.0.1:%d", ports[1]), h: fmt.Sprintf("127.0.0.1:%d", ports[2])}
}

// expand replaces {data}, {sock}, {dir}, {c}, {p} and {h}.
func (s slots) expand(v string) string {
	return strings.NewReplacer("{data}", s.data, "{sock}", s.sock, "{dir}", s.dir, "{c}", s.c, "{p}", s.p, "{h}", s.h).Replace(v)
}

// launchOutcome is what one process did with a command line.
type launchOutcome struct {
	served bool // the probe succeeded: the process is serving
	exit   int  // the exit status when it did not serve
	log    string
}

func (o launchOutcome) String() string {
	if o.served {
		return "served"
	}
	return fmt.Sprintf("exit %d", o.exit)
}

// launch runs bin with the command line and waits until probe succeeds
// (then stops it) or the process exits.
func launch(t *testing.T, bin string, args, env []string, s slots, probe func(context.Context, slots) error) launchOutcome {
	t.Helper()
	var logBuf bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.dir}, env...)
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf // read only once Wait returned
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			code := 0
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			return launchOutcome{exit: code, log: logBuf.String()}
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := probe(ctx, s)
		cancel()
		if err == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			return launchOutcome{served: true, log: logBuf.String()}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("%s %v: neither served nor exited in 30s: %v\n%s", bin, args, err, logBuf.String())
		}
		select { // a refused command line exits at once: no need to sleep it out
		case err := <-exited:
			exited <- err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeKV is a Get through clientv3 at endpoint (expanded per process).
func probeKV(endpoint string, tlsConfig *tls.Config) func(context.Context, slots) error {
	return func(ctx context.Context, s slots) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.expand(endpoint)}, DialTimeout: time.Second,
			DialOptions: []grpc.DialOption{quickRedial}, TLS: tlsConfig, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Get(ctx, "probe")
		return err
	}
}

// probeNever never succeeds: for command lines that must be refused.
func probeNever(context.Context, slots) error { return errors.New("not probed") }

type cmdlineCase struct {
	name  string
	args  []string
	env   []string
	file  string // written to {dir}/etcd.yaml
	probe func(context.Context, slots) error
	// notServing is an address a process that served must not listen on.
	notServing string
	// diverge documents a deliberate difference: etcd's launchOutcome, then
	// fdb-etcd's.
	diverge *[2]string
}

// peerArgs keep the reference etcd's raft port off the default 2380.
var peerArgs = []string{"--listen-peer-urls", "http://{p}", "--initial-advertise-peer-urls", "http://{p}", "--initial-cluster", "default=http://{p}"}

func cmdlineCases() []cmdlineCase {
	kv := probeKV("http://{c}", nil)
	serve := append([]string{"--data-dir", "{data}", "--listen-client-urls", "http://{c}", "--advertise-client-urls", "http://{c}"}, peerArgs...)
	with := func(extra ...string) []string { return append(append([]string{}, serve...), extra...) }
	return []cmdlineCase{
		{name: "kubernetes integration framework", probe: probeKV("unix://{sock}", nil), args: []string{
			"--data-dir", "{data}", "--listen-client-urls", "unix://{sock}", "--advertise-client-urls", "http://127.0.0.111:0",
			"--listen-peer-urls", "http://127.0.0.1:0", "-log-level", "warn", "--quota-backend-bytes", "8589934592",
			"--watch-progress-notify-interval", "1s"}},
		{name: "unknown flag", args: with("--no-such-flag"), probe: probeNever},
		{name: "bad number", args: with("--max-txn-ops=many"), probe: probeNever},
		{name: "URL without scheme", args: with("--listen-metrics-urls=127.0.0.1:1"), probe: probeNever},
		{name: "unknown feature gate", args: with("--feature-gates=NoSuchGate=true"), probe: probeNever},
		{name: "positional argument", args: with("extra"), probe: probeNever},
		{name: "version", args: []string{"--version"}, probe: probeNever},
		{name: "help", args: []string{"-h"}, probe: probeNever},
		{name: "environment", probe: kv, env: []string{"ETCD_DATA_DIR={data}", "ETCD_LISTEN_CLIENT_URLS=http://{c}",
			"ETCD_ADVERTISE_CLIENT_URLS=http://{c}", "ETCD_LISTEN_PEER_URLS=http://{p}", "ETCD_INITIAL_ADVERTISE_PEER_URLS=http://{p}",
			"ETCD_INITIAL_CLUSTER=default=http://{p}", "ETCD_NO_SUCH_FLAG=1", "ETCD_VERSION=9.9"}},
		{name: "environment and flag both", args: with("--name", "default"), env: []string{"ETCD_NAME=other"}, probe: probeNever},
		{name: "bad environment value", args: serve, env: []string{"ETCD_MAX_TXN_OPS=many"}, probe: probeNever},
		{name: "config file wins over flags and environment", probe: kv, notServing: "http://{h}",
			args: []string{"--config-file", "{dir}/etcd.yaml", "--listen-client-urls", "http://{h}", "--advertise-client-urls", "http://{h}"},
			env:  []string{"ETCD_LISTEN_CLIENT_URLS=http://{h}"}, file: configYAML},
		{name: "config file from ETCD_CONFIG_FILE", probe: kv, env: []string{"ETCD_CONFIG_FILE={dir}/etcd.yaml"}, file: configYAML},
		{name: "config file with a bad duration", args: []string{"--config-file", "{dir}/etcd.yaml"}, probe: probeNever,
			file: configYAML + "grpc-keepalive-min-time: 5s\n"},
		{name: "experimental and new name", args: with("--experimental-watch-progress-notify-interval=1s", "--watch-progress-notify-interval=2s"), probe: probeNever},
		{name: "election timeout too long", args: with("--election-timeout=60000"), probe: probeNever},
		{name: "host name in a listen URL", args: with("--listen-metrics-urls=http://localhost.localdomain:1"), probe: probeNever},
		{name: "capnslog", args: with("--logger=capnslog"), probe: probeNever},
		{name: "auto compaction mode", args: with("--auto-compaction-mode=weekly"), probe: probeNever},
		{name: "auto compaction retention", args: with("--auto-compaction-mode=revision", "--auto-compaction-retention=1000"), probe: kv},
		{name: "raft and peer flags", probe: kv, args: with("--snapshot-count=5", "--wal-dir={dir}/wal", "--pre-vote=false",
			"--initial-cluster-token=t", "--initial-cluster-state=new", "--max-wals=2", "--backend-batch-limit=7", "--force")},
		{name: "client cert auth on a plain URL", args: with("--client-cert-auth", "--trusted-ca-file={dir}/none.pem"), probe: kv},
		{name: "auto TLS", probe: probeKV("https://{c}", &tls.Config{InsecureSkipVerify: true}),
			args: append([]string{"--data-dir", "{data}", "--listen-client-urls", "https://{c}", "--advertise-client-urls", "https://{c}", "--auto-tls"}, peerArgs...)},
		{name: "HTTP-only client URLs", probe: probeHTTPSplit,
			args: with("--listen-client-http-urls", "http://{h}")},
		{name: "listen without advertise", args: append([]string{"--data-dir", "{data}", "--listen-client-urls", "http://{c}"}, peerArgs...),
			probe: kv, diverge: &[2]string{"exit 1", "served"}},
		{name: "bad log level", args: with("--log-level=loud"), probe: probeNever, diverge: &[2]string{"exit 2", "exit 1"}},
	}
}

const configYAML = `data-dir: {data}
listen-client-urls: http://{c}
advertise-client-urls: http://{c}
listen-peer-urls: http://{p}
initial-advertise-peer-urls: http://{p}
initial-cluster: default=http://{p}
log-level: warn
`

// probeHTTPSplit: gRPC on the client URL, /health on the HTTP-only URL.
func probeHTTPSplit(ctx context.Context, s slots) error {
	if err := probeKV("http://{c}", nil)(ctx, s); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.h+"/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/health: %s", resp.Status)
	}
	return nil
}

// fdbEnv puts fdb-etcd on FoundationDB, through its own ETCD_* variables,
// when the suite runs there (a fresh keyspace per process).
func fdbEnv() []string {
	if fdbCluster == "" {
		return nil
	}
	var id [8]byte
	_, _ = crand.Read(id[:])
	return []string{"ETCD_BACKEND=fdb", "ETCD_FDB_CLUSTER_FILE=" + fdbCluster, "ETCD_FDB_PREFIX=etcdcompat/" + hex.EncodeToString(id[:])}
}

// TestCommandLineMatchesEtcd runs each command line against etcd 3.6 and
// fdb-etcd.
func TestCommandLineMatchesEtcd(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	cand := candidateBinary(t)
	ref := etcdBinary(t)
	for _, tc := range cmdlineCases() {
		t.Run(tc.name, func(t *testing.T) {
			var got [2]launchOutcome
			for i, bin := range []string{ref, cand} {
				s := newSlots(t)
				if tc.file != "" {
					if err := os.WriteFile(filepath.Join(s.dir, "etcd.yaml"), []byte(s.expand(tc.file)), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				var args, env []string
				for _, a := range tc.args {
					args = append(args, s.expand(a))
				}
				for _, e := range tc.env {
					env = append(env, s.expand(e))
				}
				if i == 1 && !strings.Contains(strings.Join(env, " "), "ETCD_CONFIG_FILE") && !strings.Contains(strings.Join(args, " "), "--config-file") &&
					!strings.Contains(tc.name, "environment") {
					env = append(env, fdbEnv()...)
				}
				got[i] = launch(t, bin, args, env, s, tc.probe)
				if got[i].served && tc.notServing != "" {
					if c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.expand(tc.notServing), "http://"), time.Second); err == nil {
						c.Close()
						t.Errorf("%s also listens on %s, which only the ignored flags named", bin, tc.notServing)
					}
				}
			}
			t.Logf("etcd: %s, fdb-etcd: %s", got[0], got[1])
			want := [2]string{got[0].String(), got[0].String()}
			if tc.diverge != nil {
				want = *tc.diverge
			}
			if got[0].String() != want[0] || got[1].String() != want[1] {
				t.Errorf("etcd: %s, fdb-etcd: %s; want %s and %s\netcd log:\n%s\nfdb-etcd log:\n%s", got[0], got[1], want[0], want[1],
					tail(got[0].log), tail(got[1].log))
			}
		})
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// etcdMainFlags are the flags etcd's main adds to embed's (unexported in
// server/etcdmain/config.go): its own, and the ones it ignores.
var etcdMainFlags = map[string]string{
	"config-file": "", "discovery-fallback": "exit", "initial-cluster-state": "new", "v2-deprecation": "write-only",
	"version": "true", "cluster-active-size": "", "cluster-remove-delay": "", "cluster-sync-interval": "", "config": "",
	"force": "", "max-result-buffer": "", "max-retry-attempts": "", "peer-heartbeat-interval": "", "peer-election-timeout": "",
	"retry-interval": "", "snapshot": "", "v": "", "vv": "", "test.coverprofile": "", "test.outputdir": "",
}

// TestEveryEtcdFlagAccepted gives every flag of etcd 3.6 (embed.Config's
// AddFlags and etcd's main), each with its default value, to both
// binaries in one command line: both parse it and print their version.
func TestEveryEtcdFlagAccepted(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	cand := candidateBinary(t)
	ref := etcdBinary(t)
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	embed.NewConfig().AddFlags(fs)
	var args []string
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		args = append(args, "--"+f.Name+"="+f.DefValue)
	})
	// In a fixed order: a map's would put a different flag last each run.
	for _, name := range slices.Sorted(maps.Keys(etcdMainFlags)) {
		v := etcdMainFlags[name]
		n++
		switch {
		case name == "version":
		case name == "config-file":
			// A string flag: bare, it would take the next argument as
			// its value.
			args = append(args, "--config-file=")
		case v == "":
			args = append(args, "--"+name)
		default:
			args = append(args, "--"+name+"="+v)
		}
	}
	args = append(args, "--version")
	for _, bin := range []string{ref, cand} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Version:") {
			t.Fatalf("%s with all %d flags: %v\n%s", bin, n, err, out)
		}
	}
	t.Logf("%d flags of etcd 3.6 accepted by both", n)
}
