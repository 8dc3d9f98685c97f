package main

import (
	"path/filepath"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
)

// autoTLS is etcd's --auto-tls: without --cert-file and --key-file, the
// client port serves a self-signed certificate generated (once, then
// reused) under data-dir/fixtures/client, made by etcd's own generator.
// As in etcd the generated certificate replaces the client TLS settings
// entirely, so --client-cert-auth and --trusted-ca-file do not apply to
// it; a client must skip verification or trust that certificate. Other
// replicas cannot verify it either, so with several replicas on one
// FoundationDB keyspace use real certificates.
func autoTLS(c *etcdConfig, t *tlsconfig.Config, lg *zap.Logger) error {
	if !c.ClientTLS.AutoTLS {
		return nil
	}
	if !c.ClientTLS.empty() {
		lg.Warn("ignoring client auto TLS since certs given")
		return nil
	}
	var hosts []string
	for _, u := range append(append(c.ListenClientURLs[:0:0], c.ListenClientURLs...), c.ListenClientHTTPURLs...) {
		hosts = append(hosts, u.Host)
	}
	info, err := transport.SelfCert(lg, filepath.Join(c.dataDir(), "fixtures", "client"), hosts, c.SelfSignedCertValidity)
	if err != nil {
		return err
	}
	*t = tlsconfig.Config{CertFile: info.CertFile, KeyFile: info.KeyFile, CipherSuites: t.CipherSuites,
		MinVersion: t.MinVersion, MaxVersion: t.MaxVersion}
	return nil
}
