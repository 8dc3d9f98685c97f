package workload

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU is the processor time the processes of one measured run used, so
// that a row can say where its time went: in the server under test, in
// the FoundationDB servers on the host, or in the load generator (the
// harness, or the plain FoundationDB client, which is its own load
// generator). On a host whose cores they share, the three add up to what
// the row could get.
type CPU struct {
	Server time.Duration `json:"server_ns,omitempty"` // the server's processes (every replica)
	Store  time.Duration `json:"store_ns,omitempty"`  // every fdbserver process on the host
	Client time.Duration `json:"client_ns,omitempty"` // the process that generated the load
}

// cpuSample is the processes' cumulative CPU time at one moment.
type cpuSample CPU

// sampleCPU reads the CPU time of servers, of every fdbserver on the host,
// and of this process. A process that is gone counts as none.
func sampleCPU(servers []int) cpuSample {
	var s cpuSample
	for _, pid := range servers {
		s.Server += procCPU(pid)
	}
	for _, pid := range fdbservers() {
		s.Store += procCPU(pid)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.Client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return s
}

// since is the CPU used between s0 and s.
func (s cpuSample) since(s0 cpuSample) *CPU {
	return &CPU{Server: s.Server - s0.Server, Store: s.Store - s0.Store, Client: s.Client - s0.Client}
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is pid's user and system time, its threads included, from
// /proc/PID/stat; 0 if it cannot be read.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted from 3 (state) start after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * clockTick
}

// fdbservers lists the host's fdbserver processes.
func fdbservers() []int {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "fdbserver" {
			pids = append(pids, pid)
		}
	}
	return pids
}
