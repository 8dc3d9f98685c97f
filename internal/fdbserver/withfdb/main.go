// Command withfdb runs a command with FDB_CLUSTER_FILE naming a throwaway
// FoundationDB cluster, which it stops afterwards; it exits with the
// command's status. `make test-fdb` uses it for test modules that drive a
// prebuilt fdb-etcd binary and so cannot start FoundationDB themselves. The
// cluster is one `single memory` process unless flags before the command
// ask for another topology (the benchmark's replicated cluster):
//
//	go run ./internal/fdbserver/withfdb go test ./...
//	go run ./internal/fdbserver/withfdb -processes 5 -redundancy double -storage ssd-2 make bench
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var cfg fdbserver.Config
	fs := flag.NewFlagSet("withfdb", flag.ContinueOnError)
	fs.IntVar(&cfg.Processes, "processes", 1, "fdbserver processes")
	fs.StringVar(&cfg.Redundancy, "redundancy", "single", "redundancy mode: single, double or triple")
	fs.StringVar(&cfg.Storage, "storage", "memory", "storage engine: memory, ssd-2 or ssd-redwood-1")
	fs.StringVar(&cfg.StorageMemory, "storage-memory", "", "each process's --storage-memory (memory engine capacity; fdbserver's default 1GiB)")
	fs.Func("knob", "a server knob name=value for every process, after the test cluster's defaults (repeatable)", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want name=value, got %q", v)
		}
		if cfg.Knobs == nil {
			cfg.Knobs = fdbserver.DefaultKnobs()
		}
		cfg.Knobs = append(cfg.Knobs, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withfdb [-processes N] [-redundancy R] [-storage S] [-storage-memory SIZE] [-knob name=value]... command [args...]")
		return 2
	}
	srv, err := fdbserver.StartCluster(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "withfdb: start fdbserver:", err)
		return 1
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "FDB_CLUSTER_FILE="+srv.ClusterFile())
	// An interrupt reaches the command through the terminal's process group;
	// withfdb itself only has to live long enough to stop the server.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	err = cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		fmt.Fprintln(os.Stderr, "withfdb:", err)
		code = 1
	}
	srv.Stop(code != 0)
	return code
}
