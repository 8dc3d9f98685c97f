package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestLogger: etcd's logging flags, its JSON encoding and its errors.
func TestLogger(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "etcd.log")
	c, err := parseFlags([]string{"--log-outputs=" + file, "--log-level=debug", "--enable-log-rotation",
		`--log-rotation-config-json={"maxsize": 1, "maxbackups": 2}`})
	if err != nil {
		t.Fatal(err)
	}
	lg, closeLog, err := newLogger(c.etcd)
	if err != nil {
		t.Fatal(err)
	}
	lg.Debug("hello", zap.String("k", "v"))
	_ = lg.Sync()
	closeLog()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	if err := json.Unmarshal(b, &line); err != nil {
		t.Fatalf("log line %q: %v", b, err)
	}
	// etcd's encoder: an ISO 8601 time string, a lowercase level, a caller.
	if ts, _ := line["ts"].(string); !strings.Contains(ts, "T") || line["level"] != "debug" || line["msg"] != "hello" || line["k"] != "v" || line["caller"] == nil {
		t.Fatalf("log line %v", line)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--logger=capnslog"}, "--logger=capnslog is removed in v3.5"},
		{[]string{"--logger=logrus"}, `unknown logger option "logrus"`},
		{[]string{"--log-format=text"}, "unknown log format: text"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--log-outputs=default,stdout"}, `multi logoutput for "default" is not supported yet`},
		{[]string{"--enable-log-rotation"}, "--log-outputs requires a single file path"},
		{[]string{"--enable-log-rotation", "--log-outputs=" + file, "--log-rotation-config-json={"}, "improperly formatted log rotation config"},
		{[]string{"--enable-log-rotation", "--log-outputs=" + file, `--log-rotation-config-json={"maxsize":"big"}`}, "invalid log rotation config"},
	} {
		c, err := parseFlags(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if _, _, err := newLogger(c.etcd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
