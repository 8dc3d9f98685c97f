//go:build linux

package fdbserver

import "syscall"

// procAttr makes the kernel kill fdbserver if the test binary dies without
// stopping it (a panic, a test timeout, a kill).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
