package main

import (
	"flag"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// envPrefix is etcd's: the variable for --some-flag is ETCD_SOME_FLAG.
const envPrefix = "ETCD"

// flagToEnv is etcd's flags.FlagToEnv.
func flagToEnv(name string) string {
	return envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// notice is a log line parsing wants written once the configured logger
// exists (etcd logs these with a default logger during parsing).
type notice struct {
	level  zapcore.Level
	msg    string
	fields []zap.Field
}

// environ is the process environment as os.Environ gives it, injected so
// that parsing reads no global state.
type environ []string

// lookup returns the value of key, "" if unset.
func (e environ) lookup(key string) string {
	for _, kv := range e {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// without returns e minus key.
func (e environ) without(key string) environ {
	out := make(environ, 0, len(e))
	for _, kv := range e {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return out
}

// setFlagsFromEnv applies ETCD_* variables to the flags the command line
// did not set, with etcd's rules (go.etcd.io/etcd/pkg/v3/flags
// SetFlagsFromEnv): an empty variable is no value; a bad value fails with
// the variable's name; a variable for a flag that the command line also
// sets is an error (etcd exits on it); an ETCD_* variable that names no
// flag is logged as unrecognized. ETCD_VERSION is never read, as in etcd.
func setFlagsFromEnv(fs *flag.FlagSet, env environ) ([]notice, error) {
	var notes []notice
	if v := env.lookup("ETCD_VERSION"); v != "" {
		env = env.without("ETCD_VERSION")
		notes = append(notes, notice{zapcore.WarnLevel, "cannot set special environment variable",
			[]zap.Field{zap.String("key", "ETCD_VERSION"), zap.String("value", v)}})
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[flagToEnv(f.Name)] = true })
	used := map[string]bool{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		key := flagToEnv(f.Name)
		if onCommandLine[key] {
			return
		}
		val := env.lookup(key)
		if val == "" {
			return
		}
		used[key] = true
		if serr := fs.Set(f.Name, val); serr != nil {
			err = fmt.Errorf("invalid value %q for %s: %w", val, key, serr)
			return
		}
		notes = append(notes, notice{zapcore.InfoLevel, "recognized and used environment variable",
			[]zap.Field{zap.String("variable-name", key), zap.String("variable-value", val)}})
	})
	if err != nil {
		return notes, err
	}
	return verifyEnv(env, used, onCommandLine, notes)
}

// verifyEnv is etcd's check of the variables it did not use.
func verifyEnv(env environ, used, onCommandLine map[string]bool, notes []notice) ([]notice, error) {
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			notes = append(notes, notice{zapcore.WarnLevel, "found invalid environment variable",
				[]zap.Field{zap.String("environment-variable", kv)}})
		}
		if used[k] {
			continue
		}
		if onCommandLine[k] {
			return notes, fmt.Errorf("conflicting environment variable %s is shadowed by corresponding command-line flag (either unset environment variable or disable flag)", k)
		}
		if strings.HasPrefix(kv, envPrefix+"_") {
			notes = append(notes, notice{zapcore.WarnLevel, "unrecognized environment variable",
				[]zap.Field{zap.String("environment-variable", kv)}})
		}
	}
	return notes, nil
}
