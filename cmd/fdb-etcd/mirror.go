package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/url"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/migrate/mirror"
)

// mirrorFlags are `fdb-etcd mirror`'s own flags.
type mirrorFlags struct {
	from, cert, key, ca, metricsURL string
}

// runMirror is `fdb-etcd mirror --from URL`: it copies a running etcd into
// an empty store and keeps it in step until SIGTERM or SIGINT, then
// publishes the copy (docs/operations.md, "Moving from etcd").
func runMirror(args []string) error {
	fs := flag.NewFlagSet("mirror", flag.ContinueOnError)
	c := newEtcdConfig()
	storageFlags(fs, c)
	var mf mirrorFlags
	fs.StringVar(&mf.from, "from", "", "client URLs of the etcd to copy, comma-separated")
	fs.StringVar(&mf.cert, "from-cert", "", "client certificate for the source etcd")
	fs.StringVar(&mf.key, "from-key", "", "client key for the source etcd")
	fs.StringVar(&mf.ca, "from-cacert", "", "CA bundle that signed the source etcd's certificate")
	fs.StringVar(&mf.metricsURL, "listen-metrics-urls", "", "serve the mirror's Prometheus /metrics on this http URL")
	var snapDir string
	fs.StringVar(&snapDir, "snapshot-dir", "", "where the source's snapshot is kept while it loads (default: the temp dir)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if mf.from == "" || fs.NArg() > 0 {
		return errors.New("usage: fdb-etcd mirror --from URL [--from-cert F --from-key F --from-cacert F] [--data-dir DIR | --backend fdb --fdb-cluster-file F --fdb-prefix P]")
	}
	lg, closeLog, err := newLogger(c)
	if err != nil {
		return err
	}
	defer closeLog()
	defer func() { _ = lg.Sync() }()
	cli, err := sourceClient(mf)
	if err != nil {
		return err
	}
	defer cli.Close()
	db, err := openBackend(c)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg := mirror.Config{Source: cli, Target: db, Logger: lg, SnapshotDir: snapDir}
	if mf.metricsURL != "" {
		reg := prometheus.NewRegistry()
		cfg.Metrics = mirror.NewMetrics(reg)
		srv, err := serveMirrorMetrics(mf.metricsURL, reg, lg)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	return mirror.Run(ctx, cfg)
}

func sourceClient(mf mirrorFlags) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: strings.Split(mf.from, ","), DialTimeout: 10 * time.Second, Logger: zap.NewNop()}
	if mf.cert != "" || mf.ca != "" {
		info := transport.TLSInfo{CertFile: mf.cert, KeyFile: mf.key, TrustedCAFile: mf.ca}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tlsCfg
	}
	return clientv3.New(cfg)
}

// serveMirrorMetrics serves reg on u's host until the returned server is
// shut down.
func serveMirrorMetrics(raw string, reg *prometheus.Registry, lg *zap.Logger) (*http.Server, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return nil, errors.New("--listen-metrics-urls must be one http:// URL")
	}
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			lg.Warn("mirror metrics listener failed", zap.Error(err))
		}
	}()
	return srv, nil
}
