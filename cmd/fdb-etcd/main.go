// Command fdb-etcd serves etcd's v3 API from FoundationDB or, by default, an
// embedded Pebble store. Flags follow etcd's names where they mean the same.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fdb-etcd:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "version" {
		printVersion()
		return nil
	}
	if len(args) > 0 && args[0] == "healthcheck" {
		return healthcheck(args[1:])
	}
	if len(args) > 0 && args[0] == "experimental-export-persisted" {
		return exportPersisted(args[1:], os.Stdout) // test only (testhooks.go)
	}
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	if cfg.showVersion {
		printVersion()
		return nil
	}
	lg, err := newLogger(cfg.logLevel, cfg.logFormat)
	if err != nil {
		return err
	}
	defer func() { _ = lg.Sync() }()
	cfg.server.Logger = lg
	cfg.server.BuildVersion = buildVersion()

	if cfg.fdbBuggify.Enable {
		lg.Warn("TESTING AID: FoundationDB client buggify is on; the client library injects faults into every transaction",
			zap.Int("section-activated-percent", cfg.fdbBuggify.SectionActivatedPercent),
			zap.Int("section-fired-percent", cfg.fdbBuggify.SectionFiredPercent))
	}
	backend, err := openBackend(cfg)
	if err != nil {
		return err
	}
	db, err := cfg.test.wrap(backend, lg) // test-only hooks, off by default
	if err != nil {
		return err
	}
	srv, err := server.New(cfg.server, db)
	if err != nil {
		_ = db.Close()
		return err
	}
	// The backend's own client measurements (FoundationDB's retries by
	// error code, commit and read-version latency, recoveries seen) go to
	// the server's metrics. The backend, not db: test hooks may wrap it.
	if o, ok := backend.(interface{ SetObserver(fdb.Observer) }); ok {
		o.SetObserver(srv.Metrics())
	}
	if err := srv.Serve(); err != nil {
		srv.Stop()
		return err
	}
	lg.Info("fdb-etcd started", zap.String("name", cfg.server.Name), zap.String("backend", cfg.backend),
		zap.Strings("listen-client-urls", urlList(cfg.server.ListenClientURLs)),
		zap.Strings("listen-metrics-urls", urlList(cfg.server.ListenMetricsURLs)),
		zap.Bool("client-cert-auth", cfg.server.TLS.ClientCertAuth), zap.String("version", buildVersion()))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	lg.Info("shutting down", zap.String("signal", s.String()))
	srv.Stop()
	lg.Info("stopped")
	return nil
}
