package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line  int
	cmd   string // upper case
	flags map[string]string
	args  string
}

type stage struct {
	base, name string
	ins        []instruction
}

func parseDockerfile(t *testing.T, path string) (args map[string]string, stages []*stage) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	args = map[string]string{}
	var cur *stage
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
			i++
			next := strings.TrimSpace(lines[i])
			if strings.HasPrefix(next, "#") {
				continue
			}
			l = strings.TrimSuffix(l, "\\") + " " + next
		}
		cmd, rest, _ := strings.Cut(l, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), flags: map[string]string{}}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			f, r, _ := strings.Cut(rest, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			in.flags[k] = v
			rest = strings.TrimSpace(r)
		}
		in.args = rest
		switch in.cmd {
		case "FROM":
			f := strings.Fields(rest)
			cur = &stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				cur.name = f[2]
			}
			stages = append(stages, cur)
			continue
		case "ARG":
			if cur == nil {
				k, v, _ := strings.Cut(rest, "=")
				args[k] = v
				continue
			}
		}
		if cur == nil {
			t.Fatalf("%s:%d: %s before the first FROM", path, start, in.cmd)
		}
		cur.ins = append(cur.ins, in)
	}
	return args, stages
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s *stage) last(cmd string) (instruction, bool) {
	all := s.all(cmd)
	if len(all) == 0 {
		return instruction{}, false
	}
	return all[len(all)-1], true
}

func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(in.args), &out); err != nil {
		t.Fatalf("line %d: %s is not in exec form (a JSON array): %v", in.line, in.cmd, err)
	}
	return out
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	args, stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}
	fdbVersion := args["FDB_VERSION"]
	if !regexp.MustCompile(`^7\.3\.\d+$`).MatchString(fdbVersion) {
		t.Errorf("ARG FDB_VERSION=%q, want a FoundationDB 7.3.x release", fdbVersion)
	}
	if !regexp.MustCompile(`^golang:\$\{GO_VERSION\}-bookworm$`).MatchString(stages[0].base) || args["GO_VERSION"] != goVersion(t, root) {
		t.Errorf("build stage FROM %s with GO_VERSION=%s; want golang:${GO_VERSION}-bookworm matching go.mod's go %s",
			stages[0].base, args["GO_VERSION"], goVersion(t, root))
	}

	names := map[string]bool{}
	for _, s := range stages {
		if s.name != "" {
			names[s.name] = true
		}
	}
	build := stages[0]
	var runs []string
	for _, in := range build.all("RUN") {
		runs = append(runs, in.args)
	}
	joined := strings.Join(runs, "\n")
	for _, want := range []string{"make fdb-clients", "make build-fdb"} {
		if !strings.Contains(joined, want) {
			t.Errorf("build stage does not run %q (the Makefile keeps the build steps)", want)
		}
	}

	final := stages[len(stages)-1]
	if final.base != "debian:bookworm-slim" {
		t.Errorf("runtime stage FROM %s, want debian:bookworm-slim (libfdb_c needs glibc)", final.base)
	}
	copied := map[string]bool{}
	for _, in := range final.all("COPY") {
		from := in.flags["from"]
		if from == "" {
			t.Errorf("line %d: runtime stage copies from the build context; it should only take build outputs", in.line)
			continue
		}
		if !names[from] {
			t.Errorf("line %d: COPY --from=%s names no stage", in.line, from)
		}
		f := strings.Fields(in.args)
		copied[f[len(f)-1]] = true
	}
	for _, want := range []string{"/usr/lib/libfdb_c.so", "/usr/local/bin/fdb-etcd"} {
		if !copied[want] {
			t.Errorf("runtime stage does not install %s", want)
		}
	}

	user, ok := final.last("USER")
	if !ok {
		t.Fatal("runtime stage has no USER: it would run as root")
	}
	uid, _, _ := strings.Cut(user.args, ":")
	if uid == "root" || uid == "0" || uid == "" {
		t.Errorf("USER %s: must not be root", user.args)
	}
	entry, ok := final.last("ENTRYPOINT")
	if !ok {
		t.Fatal("no ENTRYPOINT")
	}
	if user.line > entry.line {
		t.Error("USER comes after ENTRYPOINT")
	}
	ep := execForm(t, entry)
	if len(ep) != 1 || ep[0] != "/usr/local/bin/fdb-etcd" {
		t.Errorf("ENTRYPOINT %v, want [\"/usr/local/bin/fdb-etcd\"]", ep)
	}

	ports := map[string]bool{}
	for _, in := range final.all("EXPOSE") {
		for _, p := range strings.Fields(in.args) {
			ports[strings.TrimSuffix(p, "/tcp")] = true
		}
	}
	for _, want := range []string{"2379", "2381"} {
		if !ports[want] {
			t.Errorf("EXPOSE lacks %s", want)
		}
	}

	hc, ok := final.last("HEALTHCHECK")
	if !ok {
		t.Fatal("no HEALTHCHECK")
	}
	_, hcCmd, found := strings.Cut(hc.args, "CMD ")
	if !found {
		t.Fatalf("HEALTHCHECK %q has no CMD", hc.args)
	}
	hcArgs := execForm(t, instruction{line: hc.line, cmd: "HEALTHCHECK", args: hcCmd})
	if len(hcArgs) < 2 || hcArgs[0] != "/usr/local/bin/fdb-etcd" || hcArgs[1] != "healthcheck" ||
		!strings.Contains(strings.Join(hcArgs, " "), "/health") {
		t.Errorf("HEALTHCHECK CMD %v, want the binary's healthcheck of /health", hcArgs)
	}
	cmd, ok := final.last("CMD")
	if !ok {
		t.Fatal("no CMD with default flags")
	}
	bin := fdbEtcd(t)
	checkFlags(t, bin, "Dockerfile CMD", execForm(t, cmd))
	checkHealthcheckFlags(t, bin, hcArgs[2:])
	if !strings.Contains(strings.Join(execForm(t, cmd), " "), "--listen-metrics-urls=http://0.0.0.0:2381") {
		t.Error("CMD does not serve metrics on 2381, where HEALTHCHECK looks")
	}
}

func TestMakefileTargets(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := string(b)
	for _, target := range []string{"build:", "build-fdb:", "fdb-clients:", "docker:", "test-deploy:"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target)).MatchString(mk) {
			t.Errorf("Makefile has no %s target", target)
		}
	}
	if !strings.Contains(mk, "foundationdb-clients_$(FDB_VERSION)-1_") || !strings.Contains(mk, "-tags fdb") {
		t.Error("Makefile does not install the official foundationdb-clients package or build with -tags fdb")
	}
	args, _ := parseDockerfile(t, filepath.Join(repoRoot(t), "Dockerfile"))
	if m := regexp.MustCompile(`(?m)^FDB_VERSION \?= (\S+)$`).FindStringSubmatch(mk); m == nil || m[1] != args["FDB_VERSION"] {
		t.Errorf("Makefile FDB_VERSION %v differs from the Dockerfile's %s", m, args["FDB_VERSION"])
	}
}
