package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"sort"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// config is a parsed command line: the etcd configuration it describes and
// what the process does with it.
type config struct {
	etcd        *etcdConfig
	showVersion bool
	// notes are log lines parsing produced, written once the configured
	// logger exists (as etcd writes them).
	notes []notice
	// notApplicable lists the etcd settings given that have no effect here;
	// they are logged once at start.
	notApplicable []string

	test testHooks // test-only hooks (testhooks.go)
}

// errUsage marks a command line the flag package refused (an unknown flag,
// a bad value): etcd exits with status 2 on those, as fdb-etcd does.
var errUsage = errors.New("usage")

// parseFlags parses args with an empty environment; tests use it.
func parseFlags(args []string) (*config, error) {
	return parseCommandLine(args, nil, io.Discard, io.Discard)
}

// parseCommandLine reads the configuration the way etcd 3.6's main does:
// the flags; then either --config-file (or ETCD_CONFIG_FILE), which then
// is the whole configuration, or the flags with ETCD_* variables for the
// flags not given; then etcd's validation. Flag errors are written to
// stderr, with a usage line, as the flag package writes them; -h lists the
// flags on stdout and returns flag.ErrHelp.
func parseCommandLine(args []string, env environ, stdout, stderr io.Writer) (*config, error) {
	ec := newEtcdConfig()
	var m etcdMainFlags
	var c config
	fs := flag.NewFlagSet("fdb-etcd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, usageLine) }
	registerEtcdFlags(fs, ec, &m)
	registerFDBEtcdFlags(fs, ec)
	registerTestFlags(fs, &c.test)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%q is not a valid flag", fs.Arg(0))
	}
	if m.printVersion {
		return &config{showVersion: true}, nil
	}
	if m.configFile == "" {
		m.configFile = env.lookup(flagToEnv("config-file"))
	}
	var err error
	if m.configFile != "" {
		if ec, err = loadConfigFile(m.configFile); err != nil {
			return nil, err
		}
		c.test = testHooks{}
		c.notes = append(c.notes, notice{zapcore.InfoLevel, "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided",
			[]zap.Field{zap.String("path", m.configFile)}})
	} else if c.notes, err = fromCommandLine(fs, ec, env); err != nil {
		return nil, err
	}
	if err := ec.validate(); err != nil {
		return nil, err
	}
	if err := ec.applyRenames(); err != nil {
		return nil, err
	}
	if err := checkBuggify(&ec.fdbEtcdConfig); err != nil {
		return nil, err
	}
	if err := checkTenancy(ec); err != nil {
		return nil, err
	}
	c.etcd = ec
	c.notes = append(c.notes, deprecationNotes(ec)...)
	c.notApplicable = notApplicable(fs, ec)
	return &c, nil
}

// usageLine is printed on a flag error, as etcd prints its own.
const usageLine = `Usage:

  fdb-etcd [flags]             serve etcd's API (etcd 3.6's flags, ETCD_* variables or --config-file)
  fdb-etcd --version | version print the version
  fdb-etcd -h | --help         list the flags
  fdb-etcd healthcheck         probe a server's /health`

// fromCommandLine completes a configuration read from flags: the ETCD_*
// variables, then etcd's rules for flags that depend on each other.
func fromCommandLine(fs *flag.FlagSet, ec *etcdConfig, env environ) ([]notice, error) {
	notes, err := setFlagsFromEnv(fs, env)
	if err != nil {
		return notes, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true; ec.explicit[f.Name] = true })
	if set["listen-client-urls"] && !set["advertise-client-urls"] {
		n, err := defaultAdvertise(ec)
		if err != nil {
			return notes, err
		}
		notes = append(notes, n)
	}
	if (ec.Durl != "" || ec.DNSCluster != "" || ec.DNSClusterServiceName != "" || len(ec.Discovery.Endpoints) > 0) && !set["initial-cluster"] {
		ec.InitialCluster = ""
	}
	return notes, experimentalGatesFromFlags(fs, ec, set)
}

// defaultAdvertise handles --listen-client-urls without
// --advertise-client-urls, which etcd refuses. fdb-etcd advertises the
// listen URLs instead, as it always has, and says that etcd would not
// start; only unix sockets, which cannot be advertised, are refused.
func defaultAdvertise(ec *etcdConfig) (notice, error) {
	for _, u := range ec.ListenClientURLs {
		if u.Scheme != "http" && u.Scheme != "https" {
			return notice{}, errors.New("--advertise-client-urls is required when --listen-client-urls is set explicitly")
		}
	}
	ec.AdvertiseClientURLs = slices.Clone(ec.ListenClientURLs)
	return notice{zapcore.WarnLevel, "--advertise-client-urls not set: advertising --listen-client-urls (etcd refuses to start without it)",
		[]zap.Field{zap.Strings("advertise-client-urls", urlList(ec.AdvertiseClientURLs))}}, nil
}

// experimentalGatesFromFlags refuses an experimental boolean flag given
// with the feature gate that replaces it, and applies it to the gate.
func experimentalGatesFromFlags(fs *flag.FlagSet, ec *etcdConfig, set map[string]bool) error {
	gates := fs.Lookup("feature-gates").Value.String()
	m := map[string]bool{}
	for name, gate := range experimentalFeatureFlags {
		if !set[name] {
			continue
		}
		v := fs.Lookup(name).Value.String() == "true"
		if strings.Contains(gates, gate) {
			return fmt.Errorf("cannot specify both flags: --%s=%v and --feature-gates=%s=%v at the same time, please just use --feature-gates=%s=%v",
				name, v, gate, ec.FeatureGates.enabled(gate), gate, ec.FeatureGates.enabled(gate))
		}
		m[gate] = v
	}
	return ec.FeatureGates.setFromMap(m)
}

// deprecationNotes are etcd 3.6's warnings for its deprecated settings.
func deprecationNotes(ec *etcdConfig) []notice {
	var notes []notice
	warn := func(msg string) { notes = append(notes, notice{zapcore.WarnLevel, msg, nil}) }
	for _, r := range experimentalRenames {
		if ec.explicit[r[0]] {
			warn(fmt.Sprintf("--%s is deprecated in v3.6 and will be decommissioned in v3.7. Use '--%s' instead.", r[0], r[1]))
		}
	}
	names := make([]string, 0, len(experimentalFeatureFlags))
	for name := range experimentalFeatureFlags {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if ec.explicit[name] {
			warn(fmt.Sprintf("--%s is deprecated in 3.6 and will be decommissioned in 3.7. Use '--feature-gates=%s=true' instead.", name, experimentalFeatureFlags[name]))
		}
	}
	for _, name := range []string{"max-snapshots", "v2-deprecation"} {
		if ec.explicit[name] {
			warn(fmt.Sprintf("--%s is deprecated and scheduled for removal in v3.8.", name))
		}
	}
	if ec.Name == defaultName {
		warn("it isn't recommended to use default name, please set a value for --name. Note that etcd might run into issue when multiple members have the same default name")
	}
	return notes
}

// notApplicable lists the settings given explicitly that have no effect
// here: the flags registered as accepted only (their usage says so), and
// --unsafe-no-fsync on FoundationDB.
func notApplicable(fs *flag.FlagSet, ec *etcdConfig) []string {
	var out []string
	for name := range ec.explicit {
		f := fs.Lookup(name)
		switch {
		case f != nil && strings.HasPrefix(f.Usage, notHere):
			out = append(out, name)
		case name == "unsafe-no-fsync" && ec.Backend == "fdb":
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func urlList(us []url.URL) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.String()
	}
	return out
}
