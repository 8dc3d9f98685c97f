package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/server/autocompact"
)

func noteMsgs(c *config) string {
	var b strings.Builder
	for _, n := range c.notes {
		b.WriteString(n.msg)
		for _, f := range n.fields {
			b.WriteString(" " + f.Key + "=" + f.String)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestEnvironment: etcd's rules for ETCD_* variables.
func TestEnvironment(t *testing.T) {
	env := environ{"ETCD_NAME=from-env", "ETCD_QUOTA_BACKEND_BYTES=4096", "ETCD_NO_SUCH_FLAG=1", "ETCD_VERSION=3.6", "HOME=/root",
		"ETCD_BACKEND=pebble", "ETCD_LOG_LEVEL="}
	c, err := parseCommandLine([]string{"--max-txn-ops=64"}, env, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.etcd.Name != "from-env" || c.etcd.QuotaBackendBytes != 4096 || c.etcd.MaxTxnOps != 64 || c.etcd.LogLevel != "info" {
		t.Fatalf("name %q quota %d txn ops %d level %q", c.etcd.Name, c.etcd.QuotaBackendBytes, c.etcd.MaxTxnOps, c.etcd.LogLevel)
	}
	if !c.etcd.explicit["name"] || !c.etcd.explicit["quota-backend-bytes"] {
		t.Fatalf("variables not counted as explicitly set: %v", c.etcd.explicit)
	}
	notes := noteMsgs(c)
	for _, want := range []string{
		"recognized and used environment variable variable-name=ETCD_NAME variable-value=from-env",
		"unrecognized environment variable environment-variable=ETCD_NO_SUCH_FLAG=1",
		"cannot set special environment variable key=ETCD_VERSION value=3.6",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	// etcd exits when a variable names a flag the command line also sets.
	_, err = parseCommandLine([]string{"--name=cli"}, environ{"ETCD_NAME=env"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "conflicting environment variable ETCD_NAME") {
		t.Fatalf("flag and variable both set: %v", err)
	}
	_, err = parseCommandLine(nil, environ{"ETCD_MAX_TXN_OPS=many"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `invalid value "many" for ETCD_MAX_TXN_OPS`) {
		t.Fatalf("bad variable: %v", err)
	}
}

// TestFlagErrors: an unknown flag or a bad value is a usage error (exit
// 2) printed by the flag package; a positional argument is etcd's error.
func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"--max-txn-ops=x"}, {"--initial-cluster-state=old"},
		{"--listen-client-urls=localhost:2379"}, {"--feature-gates=NoSuchGate=true"}, {"--max-concurrent-streams=-1"}} {
		var stderr bytes.Buffer
		_, err := parseCommandLine(args, nil, &bytes.Buffer{}, &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), "Usage:") {
			t.Errorf("%v: %v, stderr %q", args, err, stderr.String())
		}
	}
	if _, err := parseFlags([]string{"--name", "a", "extra"}); err == nil || err.Error() != `"extra" is not a valid flag` {
		t.Errorf("positional argument: %v", err)
	}
	var stdout bytes.Buffer
	if _, err := parseCommandLine([]string{"-h"}, nil, &stdout, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(stdout.String(), "-initial-cluster") {
		t.Errorf("-h: %v, stdout %d bytes", err, stdout.Len())
	}
	if c, err := parseFlags([]string{"--version", "--no-quota"}); err == nil || c != nil {
		t.Errorf("--version with an unknown flag: %v", err)
	}
	if c, err := parseFlags([]string{"--version", "--initial-cluster=garbage"}); err != nil || !c.showVersion {
		t.Errorf("--version stops before validation, as etcd's: %v", err)
	}
}

// TestEtcdValidation: what etcd 3.6's validation refuses is refused, with
// its words.
func TestEtcdValidation(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--experimental-watch-progress-notify-interval=1s", "--watch-progress-notify-interval=2s"}, "cannot set --experimental-watch-progress-notify-interval and --watch-progress-notify-interval at the same time"},
		{[]string{"--listen-client-urls=http://example.com:2379", "--advertise-client-urls=http://example.com:2379"}, "expected IP in URL for binding"},
		{[]string{"--listen-client-urls=unix:///tmp/s.sock"}, "--advertise-client-urls is required"},
		{[]string{"--advertise-client-urls=unix:///tmp/s.sock"}, `--advertise-client-urls "unix:///tmp/s.sock" must be "host:port"`},
		{[]string{"--discovery=http://d:1", "--initial-cluster=a=http://a:2380"}, "multiple discovery or bootstrap flags are set"},
		{[]string{"--discovery-token=x"}, "both --discovery-token and --discovery-endpoints must be set"},
		{[]string{"--election-timeout=60000"}, "is too long"},
		{[]string{"--heartbeat-interval=300"}, "should be at least as 5 times as --heartbeat-interval"},
		{[]string{"--auto-compaction-mode="}, "undefined auto-compaction-mode"},
		{[]string{"--auto-compaction-mode=weekly"}, `unknown auto-compaction-mode "weekly"`},
		{[]string{"--feature-gates=LeaseCheckpointPersist=true"}, "requires enabling feature gate LeaseCheckpoint"},
		{[]string{"--experimental-enable-lease-checkpoint=true", "--feature-gates=LeaseCheckpoint=true"}, "cannot specify both flags"},
		{[]string{"--compact-hash-check-time=0s"}, "--compact-hash-check-time must be >0"},
		{[]string{"--tls-min-version=TLS1.0"}, "unexpected TLS version"},
		{[]string{"--warning-unary-request-duration=1s", "--experimental-warning-unary-request-duration=1s"}, "both --experimental-warning-unary-request-duration and --warning-unary-request-duration"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestEtcdFlagEffects: the flags that mean something reach the server;
// the others are listed once as not applicable.
func TestEtcdFlagEffects(t *testing.T) {
	c, err := parseFlags([]string{
		"--listen-client-urls=unix:///tmp/x.sock,http://127.0.0.1:3379", "--advertise-client-urls=http://127.0.0.111:0",
		"--listen-client-http-urls=http://127.0.0.1:3380", "--listen-peer-urls=http://127.0.0.1:0",
		"--initial-cluster=default=http://127.0.0.1:2380", "--snapshot-count=5", "--max-concurrent-streams=0x10",
		"--experimental-watch-progress-notify-interval=3s", "--experimental-warning-apply-duration=7ms",
		"--auto-compaction-mode=revision", "--auto-compaction-retention=1000", "--cors=http://a.example:80",
		"--host-whitelist=b.example,a.example", "--socket-reuse-port", "--unsafe-no-fsync", "-log-level", "warn",
		"--name=n1", "--force",
	})
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := c.etcd.serverConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := urlList(s.ListenClientURLs); strings.Join(got, ",") != "http://127.0.0.1:3379,unix:///tmp/x.sock" {
		t.Errorf("listen URLs %v (etcd sorts them)", got)
	}
	if s.MaxConcurrentStreams != 16 || s.Watch.ProgressNotifyInterval != 3*time.Second || s.WarningApplyDuration != 7*time.Millisecond ||
		s.AutoCompaction.Mode != autocompact.Revision || s.AutoCompaction.Revisions != 1000 || !s.SocketOpts.ReusePort ||
		strings.Join(s.CORS, ",") != "http://a.example:80" || strings.Join(s.HostWhitelist, ",") != "a.example,b.example" ||
		len(s.ListenClientHTTPURLs) != 1 || c.etcd.LogLevel != "warn" || !c.etcd.UnsafeNoFsync {
		t.Errorf("server config %+v", s)
	}
	if got := strings.Join(c.notApplicable, ","); got != "initial-cluster,listen-peer-urls,snapshot-count" {
		t.Errorf("not applicable: %s", got)
	}
	if notes := noteMsgs(c); !strings.Contains(notes, "--experimental-watch-progress-notify-interval is deprecated") {
		t.Errorf("no deprecation warning:\n%s", notes)
	}
}

// TestAutoCompactionRetention: etcd's reading of the retention.
func TestAutoCompactionRetention(t *testing.T) {
	for _, tc := range []struct {
		mode, retention string
		period          time.Duration
		revs            int64
		fails           bool
	}{
		{"periodic", "0", 0, 0, false},
		{"periodic", "1", time.Hour, 0, false},
		{"periodic", "30m", 30 * time.Minute, 0, false},
		{"revision", "1000", 0, 1000, false},
		{"revision", "1us", 0, 1000, false},
		{"periodic", "soon", 0, 0, true},
		{"periodic", "-1", 0, 0, true},
	} {
		c, err := parseFlags([]string{"--auto-compaction-mode=" + tc.mode, "--auto-compaction-retention=" + tc.retention})
		if err != nil {
			t.Fatal(err)
		}
		ac, err := c.etcd.autoCompaction()
		if tc.fails {
			if err == nil {
				t.Errorf("%s %s accepted", tc.mode, tc.retention)
			}
			continue
		}
		if err != nil || ac.Period != tc.period || ac.Revisions != tc.revs {
			t.Errorf("%s %s: %+v %v", tc.mode, tc.retention, ac, err)
		}
	}
}

// TestConfigFile: etcd's YAML file, which then is the whole configuration.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "etcd.yaml")
	yaml := `name: from-file
data-dir: ` + dir + `/data
listen-client-urls: http://127.0.0.1:4379,unix:///tmp/f.sock
advertise-client-urls: http://127.0.0.1:4379
listen-peer-urls: http://127.0.0.1:4380
quota-backend-bytes: 8589934592
grpc-keepalive-min-time: 2000000000
watch-progress-notify-interval: 5000000000
log-outputs: [stderr]
auto-compaction-mode: revision
auto-compaction-retention: "10"
client-transport-security:
  cert-file: /c.pem
  key-file: /k.pem
  client-cert-auth: true
  trusted-ca-file: /ca.pem
peer-transport-security:
  cert-file: /p.pem
feature-gates: CompactHashCheck=true
backend: pebble
something-etcd-does-not-know: 1
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	env := environ{"ETCD_NAME=ignored", "ETCD_CONFIG_FILE=" + path}
	c, err := parseCommandLine([]string{"--name=also-ignored", "--max-txn-ops=5"}, env, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	e := c.etcd
	if e.Name != "from-file" || e.MaxTxnOps != defaultMaxTxnOps || e.QuotaBackendBytes != 8<<30 ||
		e.GRPCKeepAliveMinTime != 2*time.Second || e.WatchProgressNotifyInterval != 5*time.Second ||
		len(e.ListenClientURLs) != 2 || e.ClientTLS.CertFile != "/c.pem" || !e.ClientTLS.CertAuth ||
		e.PeerTLS.CertFile != "/p.pem" || !e.FeatureGates.enabled("CompactHashCheck") {
		t.Fatalf("from file: %+v", e)
	}
	if got := strings.Join(c.notApplicable, ","); got != "feature-gates,listen-peer-urls,peer-cert-file" {
		t.Errorf("not applicable: %s", got)
	}
	for _, bad := range []string{
		"grpc-keepalive-min-time: 5s\n",        // etcd's durations are nanoseconds in the file
		"listen-client-urls: localhost:2379\n", // not a URL etcd takes
		"max-txn-ops: many\n",                  // wrong type
		"peer-transport-security: yes\n",       // not a block
		"auto-compaction-mode: weekly\n",       // validation
		"feature-gates: NoSuchGate=true\n",     // unknown gate
		"experimental-initial-corrupt-check: true\nfeature-gates: InitialCorruptCheck=true\n",
	} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := parseCommandLine([]string{"--config-file", path}, nil, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("config file %q accepted", bad)
		}
	}
}
