package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/profile"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/stores"
)

// options are the command line.
type options struct {
	profile      profile.Config
	stores       []string
	out          string
	bins         stores.Binaries
	kubeBinDir   string
	kwokBin      string
	kwokModDir   string
	clusterFile  string
	scrape       time.Duration
	window       time.Duration
	nodeStatus   time.Duration
	leaseRenew   time.Duration
	clientQPS    int
	cpuProfile   time.Duration
	keepData     bool
	preset       string
	storesFlag   string
	readyTimeout time.Duration
}

// smoke is the small profile for a quick look (and a busy machine): every
// flag not given on the command line takes this value.
var smoke = map[string]string{
	"nodes": "50", "pods": "500", "pods-per-deployment": "50", "namespaces": "5",
	"churn": "2", "duration": "2m", "informers": "40", "list-interval": "20s",
	"reads": "2", "probes": "2", "bulk-objects": "200", "scrape": "10s", "window": "30s",
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	p := &o.profile
	fs.StringVar(&o.preset, "preset", "full", "full (the issue's profile) or smoke (50 nodes, 500 pods, 2 min); explicit flags override either")
	fs.StringVar(&o.storesFlag, "stores", strings.Join(stores.Kinds, ","), "stores to run, in order: etcd, pebble, fdb")
	fs.StringVar(&o.out, "out", "results", "directory for report.md, p99.png, results.json and each store's logs (emptied first)")
	fs.IntVar(&p.Nodes, "nodes", 500, "simulated nodes")
	fs.IntVar(&p.Pods, "pods", 10000, "pods, through Deployments and ReplicaSets")
	fs.IntVar(&p.PodsPerDeployment, "pods-per-deployment", 100, "replicas of each Deployment (each has a Service)")
	fs.IntVar(&p.Namespaces, "namespaces", 10, "namespaces the Deployments are spread over")
	fs.Float64Var(&p.ChurnRate, "churn", 10, "pods deleted (and recreated by their ReplicaSet) per second")
	fs.DurationVar(&p.Duration, "duration", 10*time.Minute, "length of the measured phase")
	fs.IntVar(&p.Informers, "informers", 200, "client-go informers: 70% pods by node (field selector), 1% all pods, 15% endpointslices, 14% configmaps")
	fs.DurationVar(&p.ListInterval, "list-interval", 30*time.Second, "between full LISTs of all pods (one unpaginated, one paginated)")
	fs.Int64Var(&p.ListPageSize, "list-page", 500, "page size of the paginated full LIST")
	fs.Float64Var(&p.ReadRate, "reads", 5, "GETs of pods and namespace LISTs per second")
	fs.Float64Var(&p.ProbeRate, "probes", 5, "ConfigMaps created per second to time their delivery to informers")
	fs.IntVar(&p.BulkObjects, "bulk-objects", 2000, "objects in the namespace deleted during the phase (0: none)")
	fs.Float64Var(&p.BulkDeleteAt, "bulk-delete-at", 0.25, "when the bulk namespace is deleted, as a fraction of -duration")
	fs.DurationVar(&p.SetupTimeout, "setup-timeout", 30*time.Minute, "limit for creating nodes and pods before the phase")
	fs.Int64Var(&p.Seed, "seed", 1, "seed of the churn's and the reads' choices")
	fs.DurationVar(&o.scrape, "scrape", 15*time.Second, "between scrapes of the apiserver's /metrics")
	fs.DurationVar(&o.window, "window", time.Minute, "width of the sliding window of the p99-over-time plot")
	fs.DurationVar(&o.nodeStatus, "node-status-interval", time.Minute, "kwok's node status heartbeat")
	fs.DurationVar(&o.leaseRenew, "lease-renew", 10*time.Second, "node lease renewal (the lease lasts four times this, as the kubelet's)")
	fs.IntVar(&o.clientQPS, "control-plane-qps", 100, "controller-manager's and scheduler's client QPS (burst twice)")
	fs.DurationVar(&o.cpuProfile, "cpu-profile", 30*time.Second, "CPU profile of the store (its first process) this long at the middle of the phase (0: none)")
	fs.BoolVar(&o.keepData, "keep-data", false, "keep the stores' data directories")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 3*time.Minute, "limit for a store or the apiserver to become ready")
	fs.StringVar(&o.kubeBinDir, "kube-bin-dir", os.Getenv("KUBE_BIN_DIR"), "directory with kube-apiserver, kube-controller-manager, kube-scheduler")
	fs.StringVar(&o.kwokBin, "kwok", "", "kwok binary")
	fs.StringVar(&o.kwokModDir, "kwok-module", "", "the sigs.k8s.io/kwok module directory kwok was built from (its stages)")
	fs.StringVar(&o.bins.Etcd, "etcd", "", "etcd binary")
	fs.StringVar(&o.bins.FDBEtcd, "fdb-etcd", "", "fdb-etcd binary (Pebble)")
	fs.StringVar(&o.bins.FDBEtcdFDB, "fdb-etcd-fdb", "", "fdb-etcd binary built with -tags fdb")
	fs.StringVar(&o.clusterFile, "fdb-cluster-file", os.Getenv("FDB_CLUSTER_FILE"), "FoundationDB cluster file for the fdb store")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := applyPreset(fs, o.preset); err != nil {
		return o, err
	}
	o.stores = strings.Split(o.storesFlag, ",")
	// Absolute: the kubeconfigs written there name files by these paths,
	// and a kubeconfig's relative paths are relative to itself.
	var err error
	if o.out, err = filepath.Abs(o.out); err != nil {
		return o, err
	}
	return o, o.validate()
}

// applyPreset sets the preset's values of the flags not given explicitly.
func applyPreset(fs *flag.FlagSet, preset string) error {
	switch preset {
	case "full":
		return nil
	case "smoke":
	default:
		return fmt.Errorf("-preset %q: want full or smoke", preset)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, v := range smoke {
		if !given[name] {
			if err := fs.Set(name, v); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o options) validate() error {
	var errs []error
	need := func(what, path string) {
		if path == "" {
			errs = append(errs, fmt.Errorf("-%s is required", what))
		} else if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("-%s: %w", what, err))
		}
	}
	need("kube-bin-dir", o.kubeBinDir)
	need("kwok", o.kwokBin)
	need("kwok-module", o.kwokModDir)
	for _, k := range o.stores {
		switch k {
		case stores.Etcd:
			need("etcd", o.bins.Etcd)
		case stores.Pebble:
			need("fdb-etcd", o.bins.FDBEtcd)
		case stores.FDB:
			need("fdb-etcd-fdb", o.bins.FDBEtcdFDB)
			need("fdb-cluster-file", o.clusterFile)
		default:
			errs = append(errs, fmt.Errorf("-stores: unknown store %q", k))
		}
	}
	p := o.profile
	if p.Nodes < 1 || p.Pods < 1 || p.PodsPerDeployment < 1 || p.Namespaces < 1 {
		errs = append(errs, errors.New("-nodes, -pods, -pods-per-deployment and -namespaces must be at least 1"))
	}
	if p.Duration <= 0 || o.scrape <= 0 || o.leaseRenew < time.Second {
		errs = append(errs, errors.New("-duration and -scrape must be positive, -lease-renew at least 1s"))
	}
	return errors.Join(errs...)
}
