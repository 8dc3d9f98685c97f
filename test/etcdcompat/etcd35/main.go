// Command etcd35 is etcd 3.5's own server (etcdmain, unchanged), built from
// its module so that TestImportSnapshot35Compat can take a snapshot from a
// real etcd 3.5 next to the 3.6 the rest of the suite embeds.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
