// Command withfdb runs a command with FDB_CLUSTER_FILE naming a throwaway
// single-process fdbserver, which it stops afterwards; it exits with the
// command's status. `make test-fdb` uses it for test modules that drive a
// prebuilt fdb-etcd binary and so cannot start FoundationDB themselves.
//
//	go run ./internal/fdbserver/withfdb go test ./...
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withfdb command [args...]")
		return 2
	}
	srv, err := fdbserver.Start()
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
