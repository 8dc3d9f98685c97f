package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type object = map[string]any

// loadDocs reads every YAML document of a file.
func loadDocs(path string) ([]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []any
	for {
		var v any
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if v != nil {
			out = append(out, v)
		}
	}
}

// dig walks maps by key and lists by index.
func dig(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

func str(v any, path ...string) string {
	s, _ := dig(v, path...).(string)
	return s
}

func list(v any, path ...string) []any {
	l, _ := dig(v, path...).([]any)
	return l
}

func kindName(o object) string { return str(o, "kind") + "/" + str(o, "metadata", "name") }

// resource is a manifest with the file it came from.
type resource struct {
	file string
	obj  object
}

// build is a small kustomize: resources (files and directories),
// namespace, JSON 6902 patches with targets, and configMapGenerator files.
// It checks every path a kustomization names.
func build(dir string) ([]resource, error) {
	k, err := loadDocs(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	if len(k) != 1 {
		return nil, fmt.Errorf("%s/kustomization.yaml: %d documents", dir, len(k))
	}
	kz, _ := k[0].(object)
	if str(kz, "apiVersion") != "kustomize.config.k8s.io/v1beta1" || str(kz, "kind") != "Kustomization" {
		return nil, fmt.Errorf("%s/kustomization.yaml: not a kustomize.config.k8s.io/v1beta1 Kustomization", dir)
	}
	var out []resource
	for _, r := range list(kz, "resources") {
		p := filepath.Join(dir, r.(string))
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: resource %s: %w", dir, r, err)
		}
		if fi.IsDir() {
			sub, err := build(p)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		docs, err := loadDocs(p)
		if err != nil {
			return nil, err
		}
		for _, d := range docs {
			o, ok := d.(object)
			if !ok {
				return nil, fmt.Errorf("%s: a document is not a mapping", p)
			}
			out = append(out, resource{file: p, obj: o})
		}
	}
	for _, g := range list(kz, "configMapGenerator") {
		for _, f := range list(g, "files") {
			if _, err := os.Stat(filepath.Join(dir, f.(string))); err != nil {
				return nil, fmt.Errorf("%s: configMapGenerator file: %w", dir, err)
			}
		}
		out = append(out, resource{file: filepath.Join(dir, "kustomization.yaml"), obj: object{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": object{"name": str(g, "name")},
		}})
	}
	for _, p := range list(kz, "patches") {
		path := filepath.Join(dir, str(p, "path"))
		ops, err := loadDocs(path)
		if err != nil {
			return nil, err
		}
		if len(ops) != 1 {
			return nil, fmt.Errorf("%s: want one JSON 6902 patch document", path)
		}
		var hit int
		for _, r := range out {
			if str(r.obj, "kind") != str(p, "target", "kind") || str(r.obj, "metadata", "name") != str(p, "target", "name") {
				continue
			}
			if g := str(p, "target", "group"); g != "" && !strings.HasPrefix(str(r.obj, "apiVersion"), g+"/") {
				continue
			}
			hit++
			for _, op := range ops[0].([]any) {
				if err := applyOp(r.obj, op.(object)); err != nil {
					return nil, fmt.Errorf("%s: %w", path, err)
				}
			}
		}
		if hit != 1 {
			return nil, fmt.Errorf("%s: patch target %v matches %d resources", dir, dig(p, "target"), hit)
		}
	}
	if ns := str(kz, "namespace"); ns != "" {
		for _, r := range out {
			if str(r.obj, "kind") == "Namespace" {
				continue
			}
			md, _ := r.obj["metadata"].(object)
			md["namespace"] = ns
		}
	}
	return out, nil
}

// applyOp applies one JSON 6902 operation (add, replace, remove).
func applyOp(doc object, op object) error {
	path := strings.Split(strings.TrimPrefix(str(op, "path"), "/"), "/")
	parent := dig(doc, path[:len(path)-1]...)
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		_, exists := p[last]
		switch str(op, "op") {
		case "add":
			p[last] = op["value"]
		case "replace":
			if !exists {
				return fmt.Errorf("replace %s: no such field", str(op, "path"))
			}
			p[last] = op["value"]
		case "remove":
			if !exists {
				return fmt.Errorf("remove %s: no such field", str(op, "path"))
			}
			delete(p, last)
		default:
			return fmt.Errorf("unsupported op %q", str(op, "op"))
		}
		return nil
	case []any:
		i, err := strconv.Atoi(last)
		if err != nil || i < 0 || i >= len(p) || str(op, "op") != "replace" {
			return fmt.Errorf("%s %s: unsupported list operation", str(op, "op"), str(op, "path"))
		}
		p[i] = op["value"]
		return nil
	}
	return fmt.Errorf("%s: parent does not exist", str(op, "path"))
}

func kustomizationDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(filepath.Join(repoRoot(t), "deploy"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(p))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no kustomizations under deploy/")
	}
	return dirs
}
