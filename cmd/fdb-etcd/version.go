package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/fdb-etcd/fdb-etcd/server/maintenance"
)

func printVersion() {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	fmt.Printf("fdb-etcd Version: %s\netcd API Version: %s\nGo Version: %s\nGo OS/Arch: %s/%s\n",
		v, maintenance.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
