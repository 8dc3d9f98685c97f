package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/fdb-etcd/fdb-etcd/migrate/snapimport"
)

// storageFlags registers the flags that name a store, with the server's
// names and defaults, for the subcommands that open one offline.
func storageFlags(fs *flag.FlagSet, c *etcdConfig) {
	fs.StringVar(&c.Name, "name", c.Name, "member name; the embedded store defaults to ${name}.etcd")
	fs.StringVar(&c.Dir, "data-dir", "", "data directory of the embedded store (default ${name}.etcd)")
	fs.StringVar(&c.Backend, "backend", "pebble", "storage backend: pebble or fdb")
	fs.StringVar(&c.FDBClusterFile, "fdb-cluster-file", "/etc/foundationdb/fdb.cluster", "FoundationDB cluster file (backend fdb)")
	fs.StringVar(&c.FDBPrefix, "fdb-prefix", "fdb-etcd", "the keyspace's --fdb-prefix (backend fdb)")
	fs.IntVar(&c.FDBAPIVersion, "fdb-api-version", 730, "FoundationDB client API version (backend fdb)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
}

// importSnapshot is `fdb-etcd import --snapshot FILE`: it loads an etcd
// snapshot into an empty store, which a server then serves. Run it with no
// server on the store; an interrupted import of the same file resumes.
func importSnapshot(args []string) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	c := newEtcdConfig()
	storageFlags(fs, c)
	var cfg snapimport.Config
	fs.StringVar(&cfg.Path, "snapshot", "", "etcd snapshot file (etcdctl snapshot save, or a member's member/snap/db with --skip-hash-check)")
	fs.BoolVar(&cfg.SkipHashCheck, "skip-hash-check", false, "import a file without etcd's appended SHA-256")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.Path == "" || fs.NArg() > 0 {
		return errors.New("usage: fdb-etcd import --snapshot FILE [--data-dir DIR | --backend fdb --fdb-cluster-file F --fdb-prefix P]")
	}
	if _, err := os.Stat(cfg.Path); err != nil {
		return err
	}
	lg, closeLog, err := newLogger(c)
	if err != nil {
		return err
	}
	defer closeLog()
	defer func() { _ = lg.Sync() }()
	cfg.Logger = lg
	db, err := openBackend(c)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	_, err = snapimport.Import(ctx, db, cfg)
	return err
}
