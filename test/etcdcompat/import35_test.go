package etcdcompat

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// etcd 3.5 cannot share this module with the 3.6 it embeds, so etcd35/ (its
// own module) builds etcd 3.5's unchanged server, which runs as a process.
var etcd35 struct {
	once sync.Once
	bin  string
	err  error
}

func buildEtcd35(t *testing.T) string {
	t.Helper()
	etcd35.once.Do(func() {
		dir, err := os.MkdirTemp("", "etcd35-")
		if err != nil {
			etcd35.err = err
			return
		}
		etcd35.bin = filepath.Join(dir, "etcd35")
		cmd := exec.Command("go", "build", "-o", etcd35.bin, ".")
		cmd.Dir = "etcd35"
		if out, err := cmd.CombinedOutput(); err != nil {
			etcd35.err = fmt.Errorf("building etcd 3.5: %v\n%s", err, out)
		}
	})
	if etcd35.err != nil {
		t.Fatal(etcd35.err)
	}
	return etcd35.bin
}

// removeEtcd35 removes the etcd 3.5 binary buildEtcd35 built, if it did
// (35 MB in a directory of its own per test process).
func removeEtcd35() {
	if etcd35.bin != "" {
		os.RemoveAll(filepath.Dir(etcd35.bin))
	}
}

// startEtcd35 runs etcd 3.5 on dir as a single member.
func startEtcd35(t *testing.T, dir string, cport, pport int) (*server, func(), error) {
	bin := buildEtcd35(t)
	curl, purl := fmt.Sprintf("http://127.0.0.1:%d", cport), fmt.Sprintf("http://127.0.0.1:%d", pport)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--name", memberName, "--data-dir", dir,
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", memberName+"="+purl, "--log-level", "error", "--unsafe-no-fsync")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	s, err := dialServer("etcd 3.5", fmt.Sprintf("127.0.0.1:%d", cport), nil)
	if err != nil {
		stop()
		return nil, nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := ctxOp()
		_, err := s.cli.Get(ctx, "ready")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited: // its output is complete once it has exited
			s.close()
			return nil, nil, fmt.Errorf("etcd 3.5 exited before serving:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			s.close()
			stop()
			return nil, nil, fmt.Errorf("etcd 3.5 not serving after 30s: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, func() { s.close(); stop() }, nil
}

// TestImportSnapshot35Compat is TestImportSnapshotCompat with a snapshot
// of etcd 3.5.
func TestImportSnapshot35Compat(t *testing.T) {
	t.Parallel()
	skipInTenantMode(t)
	testImportSnapshot(t, startEtcd35)
}
