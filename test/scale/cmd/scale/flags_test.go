package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// existing makes an executable-looking file for the path flags.
func existing(t *testing.T, name string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPresetAndOverrides(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-preset", "smoke", "-nodes", "7", "-stores", "pebble",
		"-kube-bin-dir", dir, "-kwok", existing(t, "kwok"), "-kwok-module", dir, "-fdb-etcd", existing(t, "fdb-etcd"), "-out", "rel"}
	o, err := parseFlags(flag.NewFlagSet("scale", flag.ContinueOnError), args)
	if err != nil {
		t.Fatal(err)
	}
	// The preset fills what was not given; what was given stays.
	if o.profile.Nodes != 7 || o.profile.Pods != 500 || o.profile.Duration != 2*time.Minute || o.scrape != 10*time.Second {
		t.Errorf("nodes %d pods %d duration %v scrape %v", o.profile.Nodes, o.profile.Pods, o.profile.Duration, o.scrape)
	}
	if !filepath.IsAbs(o.out) || filepath.Base(o.out) != "rel" {
		t.Errorf("out %q: want it absolute", o.out)
	}
	full, err := parseFlags(flag.NewFlagSet("scale", flag.ContinueOnError), args[2:])
	if err != nil {
		t.Fatal(err)
	}
	if full.profile.Pods != 10000 || full.profile.Informers != 200 || full.profile.ChurnRate != 10 {
		t.Errorf("full profile: %+v", full.profile)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-preset", "huge"}, "want full or smoke"},
		{[]string{"-stores", "kine"}, `unknown store "kine"`},
		{[]string{"-stores", "fdb"}, "-fdb-etcd-fdb is required"},
		{[]string{"-stores", "etcd", "-nodes", "0"}, "must be at least 1"},
	} {
		_, err := parseFlags(flag.NewFlagSet("scale", flag.ContinueOnError), c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
