package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/fdb-etcd/fdb-etcd/server/reqlog"
)

// registerOpsFlags adds etcd's TLS, metrics and slow-request flags to fs and
// returns the function that checks and applies them after fs.Parse.
func registerOpsFlags(fs *flag.FlagSet, c *config) func() error {
	t := &c.server.TLS
	fs.StringVar(&t.CertFile, "cert-file", "", "path to the client server TLS cert file (enables https:// listen URLs)")
	fs.StringVar(&t.KeyFile, "key-file", "", "path to the client server TLS key file")
	fs.StringVar(&t.TrustedCAFile, "trusted-ca-file", "", "path to the client server TLS trusted CA cert file")
	fs.BoolVar(&t.ClientCertAuth, "client-cert-auth", false, "refuse, at the TLS handshake, clients without a certificate signed by --trusted-ca-file")
	ciphers := fs.String("cipher-suites", "", "comma-separated list of supported TLS 1.2 cipher suites (default: Go's)")
	fs.StringVar(&t.MinVersion, "tls-min-version", "TLS1.2", "minimum TLS version: TLS1.2 or TLS1.3")
	metricsURLs := fs.String("listen-metrics-urls", "", "comma-separated URLs to serve /metrics and the health endpoints on (http or https)")
	fs.DurationVar(&c.server.WarningApplyDuration, "warning-apply-duration", reqlog.DefaultWarningApplyDuration,
		"log a warning for every request that takes longer than this (0 disables)")
	return func() error {
		if *ciphers != "" {
			t.CipherSuites = strings.Split(*ciphers, ",")
		}
		if err := t.Validate(); err != nil {
			return err
		}
		if c.server.WarningApplyDuration == 0 {
			c.server.WarningApplyDuration = -1 // the server reads 0 as the default
		}
		if *metricsURLs != "" {
			us, err := parseURLs(*metricsURLs)
			if err != nil {
				return fmt.Errorf("--listen-metrics-urls: %w", err)
			}
			c.server.ListenMetricsURLs = us
		}
		for _, u := range append(append(c.server.ListenClientURLs[:0:0], c.server.ListenClientURLs...), c.server.ListenMetricsURLs...) {
			switch {
			case u.Scheme == "https" && !t.Enabled():
				return fmt.Errorf("listen URL %s needs --cert-file and --key-file", u.String())
			case u.Scheme != "http" && u.Scheme != "https":
				return fmt.Errorf("listen URL %s: only http and https are supported", u.String())
			}
		}
		return nil
	}
}
