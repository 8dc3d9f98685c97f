package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/fdb-etcd/fdb-etcd/server/maintenance"
)

// version is fdb-etcd's release version, set at link time by the Makefile
// (-ldflags "-X main.version=..."); without it the module version is used.
var version string

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func printVersion(w io.Writer) {
	v := buildVersion()
	fmt.Fprintf(w, "fdb-etcd Version: %s\netcd API Version: %s\nGo Version: %s\nGo OS/Arch: %s/%s\n",
		v, maintenance.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
