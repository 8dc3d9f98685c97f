package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// configFile is etcd 3.6's YAML configuration file (embed.ConfigFromFile):
// the keys of etcdConfig, with the URL lists as comma-separated strings and
// TLS in client-transport-security and peer-transport-security blocks.
// Keys it does not know are ignored, as etcd ignores them, so a file
// written for etcd works here and fdb-etcd's own keys (backend,
// fdb-cluster-file, ...) are ignored by etcd.
type configFile struct {
	etcdConfig
	ListenPeerURLsJSON       string         `json:"listen-peer-urls"`
	ListenClientURLsJSON     string         `json:"listen-client-urls"`
	ListenClientHTTPURLsJSON string         `json:"listen-client-http-urls"`
	AdvertisePeerURLsJSON    string         `json:"initial-advertise-peer-urls"`
	AdvertiseClientURLsJSON  string         `json:"advertise-client-urls"`
	ListenMetricsURLsJSON    string         `json:"listen-metrics-urls"`
	CORSJSON                 string         `json:"cors"`
	HostWhitelistJSON        string         `json:"host-whitelist"`
	ClientSecurityJSON       securityConfig `json:"client-transport-security"`
	PeerSecurityJSON         securityConfig `json:"peer-transport-security"`
	FeatureGatesJSON         string         `json:"feature-gates"`
}

// loadConfigFile reads path over etcd's defaults the way etcd does: YAML
// through JSON into the typed fields (so a value of the wrong type fails
// as it fails in etcd), every top-level key counted as explicitly set.
func loadConfigFile(path string) (*etcdConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	defaultCluster := newEtcdConfig().InitialCluster
	f := &configFile{etcdConfig: *newEtcdConfig()}
	if err := yaml.Unmarshal(b, f); err != nil {
		return nil, err
	}
	if f.FeatureGatesJSON != "" {
		if err := (featureGatesFlag{&f.FeatureGates}).Set(f.FeatureGatesJSON); err != nil {
			return nil, err
		}
	}
	var keys map[string]any
	if err := yaml.Unmarshal(b, &keys); err != nil {
		return nil, err
	}
	if err := f.markExplicit(keys); err != nil {
		return nil, err
	}
	if err := f.experimentalGates(keys); err != nil {
		return nil, err
	}
	if err := f.urls(); err != nil {
		return nil, err
	}
	c := &f.etcdConfig
	if (c.Durl != "" || c.DNSCluster != "" || len(c.Discovery.Endpoints) > 0) && c.InitialCluster == defaultCluster {
		c.InitialCluster = ""
	}
	if c.ClusterState == "" {
		c.ClusterState = "new"
	}
	c.ClientTLS, c.PeerTLS = f.ClientSecurityJSON, f.PeerSecurityJSON
	if c.SelfSignedCertValidity == 0 {
		c.SelfSignedCertValidity = 1
	}
	return c, nil
}

// markExplicit records the file's keys as explicitly set, with etcd's two
// special cases: peer-transport-security's keys count as peer-<key>, and
// the misspelt experimental-snapshot-catch-up-entries as the flag's name.
func (f *configFile) markExplicit(keys map[string]any) error {
	for k := range keys {
		f.explicit[k] = true
	}
	if pts, ok := keys["peer-transport-security"]; ok {
		m, isMap := pts.(map[string]any)
		if !isMap {
			return errors.New("invalid peer-transport-security")
		}
		for k := range m {
			f.explicit["peer-"+k] = true
		}
	}
	if _, ok := keys["experimental-snapshot-catch-up-entries"]; ok {
		f.explicit["experimental-snapshot-catchup-entries"] = true
	}
	return nil
}

// experimentalGates refuses an experimental boolean key beside the feature
// gate that replaces it, as etcd does, and applies it to the gate.
func (f *configFile) experimentalGates(keys map[string]any) error {
	m := map[string]bool{}
	for name, gate := range experimentalFeatureFlags {
		v, ok := keys[name]
		if !ok {
			continue
		}
		b, isBool := v.(bool)
		if !isBool {
			return fmt.Errorf("%s: want true or false, have %v", name, v)
		}
		if strings.Contains(f.FeatureGatesJSON, gate) {
			return fmt.Errorf("cannot specify both flags: --%s=%v and --feature-gates=%s=%v at the same time, please just use --feature-gates=%s=%v",
				name, b, gate, f.FeatureGates.enabled(gate), gate, f.FeatureGates.enabled(gate))
		}
		m[gate] = b
	}
	return f.FeatureGates.setFromMap(m)
}

// urls parses the URL lists and the CORS and host lists. A bad URL list
// is fatal in etcd with these words.
func (f *configFile) urls() error {
	for _, u := range []struct {
		name string
		s    string
		dst  *[]url.URL
	}{
		{"listen-peer-urls", f.ListenPeerURLsJSON, &f.ListenPeerURLs},
		{"listen-client-urls", f.ListenClientURLsJSON, &f.ListenClientURLs},
		{"listen-client-http-urls", f.ListenClientHTTPURLsJSON, &f.ListenClientHTTPURLs},
		{"initial-advertise-peer-urls", f.AdvertisePeerURLsJSON, &f.AdvertisePeerURLs},
		{"advertise-peer-urls", f.AdvertiseClientURLsJSON, &f.AdvertiseClientURLs}, // sic: etcd's message
		{"listen-metrics-urls", f.ListenMetricsURLsJSON, &f.ListenMetricsURLs},
	} {
		if u.s == "" {
			continue
		}
		us, err := parseEtcdURLs(u.s)
		if err != nil {
			return fmt.Errorf("unexpected error setting up %s: %w", u.name, err)
		}
		*u.dst = us
	}
	if f.CORSJSON != "" {
		f.CORS = nil
		if err := (corsFlag{&f.CORS}).Set(f.CORSJSON); err != nil {
			return fmt.Errorf("cors: %w", err)
		}
	}
	if f.HostWhitelistJSON != "" {
		_ = uniqueStringsFlag{&f.HostWhitelist}.Set(f.HostWhitelistJSON)
	}
	return nil
}
