package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// healthcheck is `fdb-etcd healthcheck`: it asks a running server's /health
// and exits non-zero unless the answer is healthy. It is the container
// image's HEALTHCHECK, which has no curl.
func healthcheck(args []string) error {
	fs := flag.NewFlagSet("fdb-etcd healthcheck", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:2381/health", "health endpoint to query (the metrics listener, or the client port)")
	timeout := fs.Duration("timeout", 5*time.Second, "request timeout")
	cacert := fs.String("cacert", "", "CA bundle to verify an https endpoint with")
	cert := fs.String("cert", "", "client certificate for an https endpoint that requires one")
	key := fs.String("key", "", "client key for --cert")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			return err
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--cacert %s: no certificate", *cacert)
		}
	}
	if *cert != "" {
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			return err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	hc := &http.Client{Timeout: *timeout, Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := hc.Get(*url)
	if err != nil {
		return fmt.Errorf("unhealthy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("unhealthy: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Println(strings.TrimSpace(string(body)))
	return nil
}
