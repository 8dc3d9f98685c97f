package main

import (
	"github.com/fdb-etcd/fdb-etcd/server"
)

// parseServer parses args (no environment) into the server configuration.
func parseServer(args []string) (server.Config, error) {
	c, err := parseFlags(args)
	if err != nil {
		return server.Config{}, err
	}
	s, _, err := c.etcd.serverConfig()
	return s, err
}
