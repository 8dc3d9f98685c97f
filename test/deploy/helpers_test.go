package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// binPath is the fdb-etcd binary built once by TestMain.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fdb-etcd-deploy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "fdb-etcd")
	root, _ := filepath.Abs("../..")
	cmd := exec.Command("go", "build", "-o", binPath, "./cmd/fdb-etcd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fdb-etcd: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func fdbEtcd(t *testing.T) string {
	t.Helper()
	return binPath
}

// goVersion is go.mod's language version as major.minor.
func goVersion(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return m[1]
}

var kubeVar = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

// checkFlags runs the real binary's flag parser over args: fdb-etcd parses
// and checks every flag, then --version makes it exit before serving.
func checkFlags(t *testing.T, bin, where string, args []string) {
	t.Helper()
	var expanded []string
	for _, a := range args {
		expanded = append(expanded, kubeVar.ReplaceAllString(a, "value-of-$1"))
	}
	out, err := exec.Command(bin, append(expanded, "--version")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fdb-etcd Version:") {
		t.Errorf("%s: fdb-etcd rejects its arguments %q: %v\n%s", where, args, err, out)
	}
}

// checkHealthcheckFlags checks that `fdb-etcd healthcheck` knows the flags;
// nothing listens on port 1, so it must fail, but not on a flag.
func checkHealthcheckFlags(t *testing.T, bin string, args []string) {
	t.Helper()
	out, _ := exec.Command(bin, append(append([]string{"healthcheck"}, args...), "--url", "http://127.0.0.1:1/health", "--timeout", "100ms")...).CombinedOutput()
	if strings.Contains(string(out), "flag provided but not defined") || !strings.Contains(string(out), "unhealthy") {
		t.Errorf("fdb-etcd healthcheck %q: %s", args, out)
	}
}
