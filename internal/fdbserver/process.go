package fdbserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one fdbserver of a cluster, on a fixed address and data
// directory across restarts.
type process struct {
	index int
	addr  string
	bin   string
	args  []string
	out   string // stdout and stderr, appended across restarts

	mu sync.Mutex
	// cmd is the running (or last) process, nil before the first start;
	// done is closed when it has exited, after waitErr is set.
	cmd     *exec.Cmd     // guarded by mu
	done    chan struct{} // guarded by mu
	waitErr error         // guarded by mu
	// wanted is false once the process was told to exit (killed, or asked
	// to reboot): an exit then is no failure.
	wanted bool // guarded by mu
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runningLocked() {
		return fmt.Errorf("fdbserver %s is already running", p.addr)
	}
	out, err := os.OpenFile(p.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.cmd, p.done, p.wanted = cmd, done, true
	// The waiter ends when the process exits; every way of stopping a
	// cluster kills its processes.
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// runningLocked reports whether the process has been started and has not
// exited.
func (p *process) runningLocked() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runningLocked()
}

// signal sends sig to a running process.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningLocked() {
		return fmt.Errorf("fdbserver %s is not running", p.addr)
	}
	return p.cmd.Process.Signal(sig)
}

// wait waits up to d for the process to exit and reports whether it did.
func (p *process) wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// kill ends the process with SIGKILL (a paused one too) and waits for it.
func (p *process) kill() error {
	p.mu.Lock()
	if !p.runningLocked() {
		p.mu.Unlock()
		return nil
	}
	p.wanted = false
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	p.mu.Unlock()
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	p.wait(time.Minute)
	return nil
}

// terminate asks the process to exit (SIGTERM, after SIGCONT so that a
// paused one can), and kills it after grace.
func (p *process) terminate(grace time.Duration) {
	p.mu.Lock()
	if !p.runningLocked() {
		p.mu.Unlock()
		return
	}
	p.wanted = false
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.mu.Unlock()
	if !p.wait(grace) {
		_ = p.kill()
	}
}

// expectExit notes that the process was asked to exit by other means
// (fdbcli kill).
func (p *process) expectExit() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wanted = false
}

// failed reports whether the process exited without being told to.
func (p *process) failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && p.wanted && !p.runningLocked()
}

// exitReport says how the last run ended and shows the end of its output.
func (p *process) exitReport() string {
	p.mu.Lock()
	err := p.waitErr
	p.mu.Unlock()
	b, _ := os.ReadFile(p.out)
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return fmt.Sprintf("fdbserver %s exited (%v): %s", p.addr, err, s)
}
