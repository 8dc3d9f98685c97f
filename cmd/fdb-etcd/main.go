// Command fdb-etcd serves etcd's v3 API from FoundationDB or, by default, an
// embedded Pebble store. It takes etcd 3.6's command line (its flags,
// ETCD_* environment variables and --config-file), so that it can be
// installed as etcd.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb"
)

func main() {
	code := run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if err := stopFDB(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// run is the process: it returns the exit status, etcd's for the same
// command line (2 for a flag the flag package refuses, 1 for a
// configuration etcd refuses or a failure, 0 for -h and --version).
func run(args []string, env environ, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if code, ok := runSubcommand(args, stdout, stderr); ok {
			return code
		}
	}
	cfg, err := parseCommandLine(args, env, stdout, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "fdb-etcd:", err)
		return 1
	}
	if cfg.showVersion {
		printVersion(stdout)
		return 0
	}
	if err := serve(cfg); err != nil {
		fmt.Fprintln(stderr, "fdb-etcd:", err)
		return 1
	}
	return 0
}

// runSubcommand runs fdb-etcd's subcommands; ok is false when args[0] is
// none of them.
func runSubcommand(args []string, stdout, stderr io.Writer) (code int, ok bool) {
	var err error
	switch args[0] {
	case "version":
		printVersion(stdout)
	case "tenant":
		err = runTenantCommand(args[1:], stdout)
	case "healthcheck":
		err = healthcheck(args[1:])
	case "import":
		err = importSnapshot(args[1:])
	case "mirror":
		err = runMirror(args[1:])
	case "gateway", "grpc-proxy":
		err = fmt.Errorf("etcd's %s mode is not provided: every fdb-etcd member serves every request, so point clients at the members (or a Service in front of them) directly", args[0])
	default:
		test := testSubcommand(args[0]) // test builds only (testhooks.go)
		if test == nil {
			return 0, false
		}
		err = test(args[1:], stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fdb-etcd:", err)
		return 1, true
	}
	return 0, true
}

// serve runs the server until SIGTERM or SIGINT.
func serve(cfg *config) error {
	ec := cfg.etcd
	lg, closeLog, err := newLogger(ec)
	if err != nil {
		return err
	}
	defer closeLog()
	defer func() { _ = lg.Sync() }()
	sc, err := serverConfig(cfg, lg)
	if err != nil {
		return err
	}
	stop, err := startServer(cfg, sc, lg)
	if err != nil {
		return err
	}
	lg.Info("fdb-etcd started", zap.String("name", sc.Name), zap.String("backend", ec.Backend),
		zap.Strings("listen-client-urls", urlList(sc.ListenClientURLs)),
		zap.Strings("listen-metrics-urls", urlList(sc.ListenMetricsURLs)),
		zap.Bool("client-cert-auth", sc.TLS.ClientCertAuth), zap.String("tenancy", cfg.etcd.Tenancy),
		zap.String("version", buildVersion()))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	lg.Info("shutting down", zap.String("signal", s.String()))
	stop()
	lg.Info("stopped")
	return nil
}

// serverConfig logs what parsing noted (once, with the configured logger),
// then builds the server's configuration, with --auto-tls's certificate.
func serverConfig(cfg *config, lg *zap.Logger) (server.Config, error) {
	ec := cfg.etcd
	sc, notes, err := ec.serverConfig()
	logNotes(lg, append(cfg.notes, notes...))
	if len(cfg.notApplicable) > 0 {
		lg.Warn("flags accepted for etcd compatibility have no effect here (no raft, no peers, no bbolt)",
			zap.Strings("flags", cfg.notApplicable))
	}
	if err != nil {
		return sc, err
	}
	if err := autoTLS(ec, &sc.TLS, lg); err != nil {
		return sc, err
	}
	sc.Logger = lg
	sc.BuildVersion = buildVersion()
	if b := ec.FDBBuggify; b.Enable {
		lg.Warn("TESTING AID: FoundationDB client buggify is on; the client library injects faults into every transaction",
			zap.Int("section-activated-percent", b.SectionActivatedPercent), zap.Int("section-fired-percent", b.SectionFiredPercent))
	}
	return sc, nil
}

// startServer opens the store and serves it; the function it returns
// stops serving and closes the store.
func startServer(cfg *config, sc server.Config, lg *zap.Logger) (func(), error) {
	backend, err := openBackend(cfg.etcd)
	if err != nil {
		return nil, err
	}
	db, err := cfg.test.wrap(backend, lg) // test-only hooks, off by default
	if err != nil {
		return nil, err
	}
	if cfg.etcd.Tenancy == tenancyClientCertCN {
		return startTenancy(cfg, sc, backend, db, lg)
	}
	srv, err := server.New(sc, db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	observeBackend(backend, srv)
	if err := srv.Serve(); err != nil {
		srv.Stop()
		return nil, err
	}
	return srv.Stop, nil
}

// observeBackend sends the backend's own client measurements
// (FoundationDB's retries by error code, commit and read-version latency,
// recoveries seen) to the server's metrics. The backend, not the store the
// server has: test hooks may wrap it.
func observeBackend(backend storage.DB, srv *server.Server) {
	if o, ok := backend.(interface{ SetObserver(fdb.Observer) }); ok {
		o.SetObserver(srv.Metrics())
	}
}

// logNotes writes what parsing had to say, now that the logger exists.
func logNotes(lg *zap.Logger, notes []notice) {
	for _, n := range notes {
		if ce := lg.Check(n.level, n.msg); ce != nil {
			ce.Write(n.fields...)
		}
	}
}
