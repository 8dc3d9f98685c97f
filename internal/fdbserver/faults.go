package fdbserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"
)

// rebootExitWait is how long a process asked to reboot by fdbcli kill has to
// exit before the request is sent again.
const rebootExitWait = 15 * time.Second

func (c *Cluster) proc(i int) (*process, error) {
	if i < 0 || i >= len(c.procs) {
		return nil, fmt.Errorf("fdbserver: no process %d (the cluster has %d)", i, len(c.procs))
	}
	return c.procs[i], nil
}

// Kill ends process i with SIGKILL, as a crash would, and waits until it
// has exited. Killing a stopped process is not an error.
func (c *Cluster) Kill(i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	return p.kill()
}

// Pause stops process i with SIGSTOP: it keeps its connections and roles
// but answers nothing, as a hung machine or a long GC pause would, until
// Resume.
func (c *Cluster) Pause(i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	return p.signal(syscall.SIGSTOP)
}

// Resume continues a paused process (SIGCONT).
func (c *Cluster) Resume(i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	return p.signal(syscall.SIGCONT)
}

// Restart starts process i again, on its address and data directory, after
// Kill, KillAll or a reboot. It does not wait for the cluster to recover.
func (c *Cluster) Restart(i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	return p.start()
}

// Running reports whether process i is running (a paused process is).
func (c *Cluster) Running(i int) bool {
	p, err := c.proc(i)
	return err == nil && p.running()
}

// KillAll kills every process at once, as a power loss would.
func (c *Cluster) KillAll() { c.killAll() }

// RestartAll starts every process that is not running.
func (c *Cluster) RestartAll() error {
	var errs []error
	for _, p := range c.procs {
		if !p.running() {
			errs = append(errs, p.start())
		}
	}
	return errors.Join(errs...)
}

// ForceRecovery reboots every process through `fdbcli kill; kill all`, the
// way an operator forces a recovery: each process exits, and (fdbmonitor's
// job in production) is started again. Every commit in flight may answer
// commit_unknown_result, and commits wait until the recovery ends.
func (c *Cluster) ForceRecovery(ctx context.Context) error {
	all := make([]int, len(c.procs))
	for i := range all {
		all[i] = i
	}
	return c.Reboot(ctx, all...)
}

// Reboot asks the given processes to reboot through fdbcli kill and, as
// fdbmonitor does in production, starts each again as soon as it has
// exited. It returns once they run; the cluster may still be recovering.
func (c *Cluster) Reboot(ctx context.Context, idx ...int) error {
	pending := make([]*process, 0, len(idx))
	for _, i := range idx {
		p, err := c.proc(i)
		if err != nil {
			return err
		}
		pending = append(pending, p)
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 3 {
			return fmt.Errorf("fdbserver: %d processes did not exit after fdbcli kill", len(pending))
		}
		addrs := make([]string, len(pending))
		for i, p := range pending {
			p.expectExit()
			addrs[i] = p.addr
		}
		// The first kill lists the workers (needs the cluster controller);
		// the reboot request is sent without waiting, so fdbcli must stay
		// up a moment for it to leave. fdbcli itself lingers for seconds
		// with its cluster gone, so processes are restarted while it runs.
		// Its own failures show as processes that do not exit.
		cliDone := make(chan struct{})
		go func() {
			defer close(cliDone)
			_, _ = c.cli(ctx, "kill; kill "+strings.Join(addrs, " ")+"; sleep 1", 20)
		}()
		stayed, err := restartOnExit(pending)
		<-cliDone
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		pending = stayed
	}
	return nil
}

// restartOnExit starts each process again as soon as it exits, and returns
// the ones that did not exit within rebootExitWait.
func restartOnExit(ps []*process) ([]*process, error) {
	var (
		mu      sync.Mutex
		stayed  []*process
		errs    []error
		restart sync.WaitGroup
	)
	for _, p := range ps {
		restart.Add(1)
		go func() {
			defer restart.Done()
			if !p.wait(rebootExitWait) {
				mu.Lock()
				stayed = append(stayed, p)
				mu.Unlock()
				return
			}
			if err := p.start(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	restart.Wait()
	return stayed, errors.Join(errs...)
}

// Exclude moves data and roles off process i (`fdbcli exclude`) and returns
// once FoundationDB says it is safe to remove; the process keeps running.
func (c *Cluster) Exclude(ctx context.Context, i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	return c.cliUntil(ctx, "exclude "+p.addr, "safe to remove")
}

// Include undoes Exclude (`fdbcli include`).
func (c *Cluster) Include(ctx context.Context, i int) error {
	p, err := c.proc(i)
	if err != nil {
		return err
	}
	out, err := c.cli(ctx, "include "+p.addr, 20)
	if err != nil {
		return fmt.Errorf("fdbcli include %s: %w: %s", p.addr, err, out)
	}
	return nil
}
