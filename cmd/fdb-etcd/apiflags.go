package main

import (
	"flag"
)

// registerAPIFlags adds etcd's flags for the JSON gateway and the backend
// quota to fs, and returns the function that applies them after fs.Parse.
func registerAPIFlags(fs *flag.FlagSet, c *config) func() {
	fs.Int64Var(&c.server.Quota.Bytes, "quota-backend-bytes", 0,
		"raise the NOSPACE alarm and refuse writes that add data once the store would exceed this many bytes; 0 means etcd's default, 2 GiB; negative disables the quota")
	gateway := fs.Bool("enable-grpc-gateway", true, "serve etcd's /v3/ JSON gateway on the client port")
	return func() { c.server.DisableGRPCGateway = !*gateway }
}
