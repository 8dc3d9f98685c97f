// Command scale runs a simulated Kubernetes cluster (kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok) on each store in turn
// (etcd, fdb-etcd on Pebble, three fdb-etcd replicas on FoundationDB),
// drives the same profile against each, and reports the apiserver's own
// SLIs side by side: a markdown table with the targets, a PNG of p99 over
// time, and the numbers as JSON, in -out. `make scale` builds what it needs
// and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

func main() {
	os.Exit(run())
}

func run() int {
	o, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 2
	}
	// client-go's own logging (reflector retries, throttling) would bury
	// the progress lines; the harness counts what matters itself.
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := newHarness(o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		return 1
	}
	return h.runAll(ctx)
}
