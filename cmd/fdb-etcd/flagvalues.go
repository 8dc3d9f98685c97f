package main

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// The flag.Value types below take etcd 3.6's value syntax for its list and
// choice flags (go.etcd.io/etcd/pkg/v3/flags), so that a value etcd accepts
// is accepted here and one it refuses is refused.

// urlsFlag is a comma-separated list of URLs (etcd's UniqueURLs): each
// must be http(s)://host:port without a path, or unix(s)://path; duplicates
// are dropped and the list is sorted, as etcd sorts it. A value in allowed
// (etcd passes "" or "*") is taken without parsing and leaves the URLs as
// they were.
type urlsFlag struct {
	dst     *[]url.URL
	values  map[string]bool
	allowed map[string]bool
}

func newURLsFlag(dst *[]url.URL, allowed ...string) *urlsFlag {
	f := &urlsFlag{dst: dst, values: map[string]bool{}, allowed: map[string]bool{}}
	for _, a := range allowed {
		f.allowed[a] = true
	}
	for _, u := range *dst {
		f.values[u.String()] = true
	}
	return f
}

func (f *urlsFlag) Set(s string) error {
	if f.values[s] {
		return nil
	}
	if f.allowed[s] {
		f.values[s] = true
		return nil
	}
	us, err := parseEtcdURLs(s)
	if err != nil {
		return err
	}
	f.values = map[string]bool{}
	*f.dst = (*f.dst)[:0:0]
	for _, u := range us {
		if f.values[u.String()] {
			continue
		}
		f.values[u.String()] = true
		*f.dst = append(*f.dst, u)
	}
	return nil
}

func (f *urlsFlag) String() string {
	if f == nil {
		return ""
	}
	all := make([]string, 0, len(f.values))
	for v := range f.values {
		all = append(all, v)
	}
	sort.Strings(all)
	return strings.Join(all, ",")
}

// parseEtcdURLs parses a comma-separated URL list as etcd's types.NewURLs
// does (sorted).
func parseEtcdURLs(s string) ([]url.URL, error) {
	us, err := types.NewURLs(strings.Split(s, ","))
	if err != nil {
		return nil, err
	}
	return []url.URL(us), nil
}

// corsFlag is etcd's --cors: "*", or URLs (parsed as etcd parses them),
// kept as a sorted set of strings.
type corsFlag struct{ dst *[]string }

func (f corsFlag) Set(s string) error {
	if s == "*" {
		if !slices.Contains(*f.dst, "*") {
			*f.dst = append(*f.dst, "*")
			slices.Sort(*f.dst)
		}
		return nil
	}
	us, err := parseEtcdURLs(s)
	if err != nil {
		return err
	}
	out := make([]string, 0, len(us))
	for _, u := range us {
		out = append(out, u.String())
	}
	*f.dst = slices.Compact(out)
	return nil
}

func (f corsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

// uniqueStringsFlag is a comma-separated set (etcd's UniqueStringsValue):
// a new value replaces the set; it reads back sorted.
type uniqueStringsFlag struct{ dst *[]string }

func (f uniqueStringsFlag) Set(s string) error {
	vs := strings.Split(s, ",")
	slices.Sort(vs)
	*f.dst = slices.Compact(vs)
	return nil
}

func (f uniqueStringsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

// stringsFlag is a comma-separated list kept in order (etcd's
// StringsValue).
type stringsFlag struct{ dst *[]string }

func (f stringsFlag) Set(s string) error {
	*f.dst = strings.Split(s, ",")
	return nil
}

func (f stringsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

// uint32Flag is etcd's Uint32Value: any base strconv accepts.
type uint32Flag struct{ dst *uint32 }

func (f uint32Flag) Set(s string) error {
	v, err := strconv.ParseUint(s, 0, 32)
	*f.dst = uint32(v)
	return err
}

func (f uint32Flag) String() string {
	if f.dst == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*f.dst), 10)
}

// choiceFlag takes one of a fixed set of values (etcd's
// SelectiveStringValue).
type choiceFlag struct {
	dst    *string
	valids []string
}

func (f choiceFlag) Set(s string) error {
	if !slices.Contains(f.valids, s) {
		return errors.New("invalid value")
	}
	*f.dst = s
	return nil
}

func (f choiceFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return *f.dst
}

// choicesFlag takes a comma-separated list from a fixed set of values
// (etcd's SelectiveStringsValue).
type choicesFlag struct {
	dst    *string
	valids []string
}

func (f choicesFlag) Set(s string) error {
	var got []string
	if *f.dst != "" {
		got = strings.Split(*f.dst, ",")
	}
	for _, v := range strings.Split(s, ",") {
		if !slices.Contains(f.valids, v) {
			return fmt.Errorf("invalid value %q", v)
		}
		got = append(got, v)
	}
	sort.Strings(got)
	*f.dst = strings.Join(got, ",")
	return nil
}

func (f choicesFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return *f.dst
}

// ignoredFlag is one of the flags etcd still accepts and ignores without a
// word (etcdmain's ignored list): it takes no value, like a boolean.
type ignoredFlag struct{}

func (ignoredFlag) IsBoolFlag() bool { return true }
func (ignoredFlag) Set(string) error { return nil }
func (ignoredFlag) String() string   { return "" }

// featureGates is etcd 3.6's --feature-gates: Name=bool pairs over its
// server features, and AllAlpha/AllBeta.
type featureGates map[string]bool

// etcdFeatures are etcd 3.6's server feature gates with their maturity
// (server/features/etcd_features.go); AllAlpha and AllBeta switch every
// gate of that maturity.
var etcdFeatures = map[string]string{
	"StopGRPCServiceOnDefrag":      "alpha",
	"InitialCorruptCheck":          "alpha",
	"CompactHashCheck":             "alpha",
	"TxnModeWriteWithSharedBuffer": "beta",
	"LeaseCheckpoint":              "alpha",
	"LeaseCheckpointPersist":       "alpha",
	"SetMemberLocalAddr":           "alpha",
	"AllAlpha":                     "alpha",
	"AllBeta":                      "beta",
}

// etcdFeatureDefaults are the gates enabled by default.
var etcdFeatureDefaults = map[string]bool{"TxnModeWriteWithSharedBuffer": true}

// featureGatesFlag parses --feature-gates into a featureGates map.
type featureGatesFlag struct{ dst *featureGates }

func (f featureGatesFlag) Set(value string) error {
	m := map[string]bool{}
	for _, s := range strings.Split(value, ",") {
		if s == "" {
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		k = strings.TrimSpace(k)
		if !ok {
			return fmt.Errorf("missing bool value for %s", k)
		}
		v = strings.TrimSpace(v)
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("invalid value of %s=%s, err: %w", k, v, err)
		}
		m[k] = b
	}
	return f.dst.setFromMap(m)
}

func (f featureGatesFlag) String() string {
	if f.dst == nil {
		return ""
	}
	var pairs []string
	for k, v := range *f.dst {
		pairs = append(pairs, fmt.Sprintf("%s=%t", k, v))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

// setFromMap sets known gates; an unknown one fails, as in etcd.
func (g *featureGates) setFromMap(m map[string]bool) error {
	for k := range m {
		if _, ok := etcdFeatures[k]; !ok {
			return fmt.Errorf("unrecognized feature gate: %s", k)
		}
	}
	if *g == nil {
		*g = featureGates{}
	}
	for k, v := range m {
		(*g)[k] = v
	}
	return nil
}

// enabled reports a gate's value: set explicitly, else switched by
// AllAlpha/AllBeta, else its default.
func (g featureGates) enabled(name string) bool {
	if v, ok := g[name]; ok {
		return v
	}
	switch etcdFeatures[name] {
	case "alpha":
		if v, ok := g["AllAlpha"]; ok {
			return v
		}
	case "beta":
		if v, ok := g["AllBeta"]; ok {
			return v
		}
	}
	return etcdFeatureDefaults[name]
}
