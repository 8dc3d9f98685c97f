package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/servers"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// rawSpec is what the plain FoundationDB client does for row w as server
// name, or, in None, why it has nothing to compare with the row.
func rawSpec(name string, w workload.Workload, p workload.Params) workload.RawSpec {
	rw, ok := w.(workload.RawEquivalent)
	if !ok {
		return workload.RawSpec{None: "no plain-FoundationDB equivalent"}
	}
	s := rw.Raw(p)
	if s.Op != "" && name == servers.FDBRawBatched {
		if !s.Batchable {
			return workload.RawSpec{None: "not a write: there is nothing to group-commit (the fdb-raw column is the ceiling)"}
		}
		s.Batched = true
	}
	return s
}

// runRaw runs row w with the plain FoundationDB client bin in inst's
// keyspace: one process per row, as a server is one process beside the
// cluster, which prints the row's Result on its standard output. Its
// standard error goes to fdb-raw.log in the instance's directory.
func runRaw(ctx context.Context, name, bin string, inst *servers.Instance, w workload.Workload, p workload.Params) (workload.Result, error) {
	spec := rawSpec(name, w, p)
	if spec.Op == "" {
		return workload.Result{NoEquivalent: spec.None}, nil
	}
	arg, err := json.Marshal(spec)
	if err != nil {
		return workload.Result{}, err
	}
	logF, err := os.OpenFile(filepath.Join(inst.Dir, "fdb-raw.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return workload.Result{}, err
	}
	defer logF.Close()
	fmt.Fprintf(logF, "== %s %s\n", time.Now().Format(time.RFC3339), w.Name())
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-cluster-file", inst.ClusterFile(), "-keyspace", inst.Prefix, "-spec", string(arg))
	cmd.Stderr = io.MultiWriter(logF, &stderr)
	// On a timeout or ^C: SIGTERM, then SIGKILL if it has not exited.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.Output()
	if err != nil {
		return workload.Result{}, fmt.Errorf("%s: %v: %s", filepath.Base(bin), err, lastLine(stderr.String()))
	}
	var res workload.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return workload.Result{}, fmt.Errorf("%s printed no result: %w", filepath.Base(bin), err)
	}
	return res, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
