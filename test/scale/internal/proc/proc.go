// Package proc runs the processes of a scale run (stores, Kubernetes
// components, kwok) with their output in a log file, and reads their CPU time
// and memory from /proc.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 20 * time.Second

// Proc is one running child process.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	once    sync.Once
}

// Start runs bin with args; stdout and stderr go to logPath (appended). The
// child gets its own process group, so a terminal's ^C reaches only the
// harness, which then stops it, and is killed if the harness dies.
func Start(name, bin string, args, env []string, logPath string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// PIDs are the process ids of ps.
func PIDs(ps []*Proc) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = p.PID()
	}
	return out
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits, then SIGKILL after stopGrace.
func (p *Proc) Stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// LogTail returns the last n lines of the process's log.
func (p *Proc) LogTail(n int) string { return FileTail(p.LogPath, n) }

// FileTail returns the last n lines of a file, or why it cannot.
func FileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Usage is what /proc says about a process at one moment.
type Usage struct {
	CPU     time.Duration // user + system time so far
	RSS     int64         // resident set size now, bytes
	PeakRSS int64         // high-water mark of the resident set (VmHWM), bytes
}

// clockTick is USER_HZ, the unit of the times in /proc/PID/stat; it is 100
// on every Linux architecture Go supports.
const clockTick = 100

// ReadUsage reads /proc/PID/stat and /proc/PID/status.
func ReadUsage(pid int) (Usage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	// The command name (field 2) is parenthesised and may hold spaces: the
	// fields after it start after the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Usage{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return Usage{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Usage{}, err
	}
	u := Usage{CPU: time.Duration(ut+st) * time.Second / clockTick}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			u.RSS = kib(v)
		} else if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			u.PeakRSS = kib(v)
		}
	}
	return u, nil
}

func kib(field string) int64 {
	f := strings.Fields(field)
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return n * 1024
}

// FindByArg returns the pid of a process named comm whose command line has
// arg among its arguments (how the harness finds the fdbserver that
// FDB_CLUSTER_FILE's cluster runs on, which a wrapper started).
func FindByArg(comm, arg string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(cl), "\x00") {
			if a == arg {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no %s process with argument %s", comm, arg)
}

// CancelOnExit cancels ctx, with the process's exit and its log's tail as
// the cause, as soon as any of procs ends; a wait for something those
// processes do then ends at once instead of at its timeout. Its goroutines
// end with ctx.
func CancelOnExit(ctx context.Context, cancel context.CancelCauseFunc, procs ...*Proc) {
	for _, p := range procs {
		go func() {
			select {
			case <-ctx.Done():
			case <-p.done:
				cancel(fmt.Errorf("%s exited (%v):\n%s", p.Name, p.waitErr, p.LogTail(30)))
			}
		}()
	}
}
