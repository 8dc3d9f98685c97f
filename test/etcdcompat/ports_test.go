package etcdcompat

import (
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// portLocks is the directory of the port reservations, shared by every
// process of this package on the machine: the plain and the tenant runs
// go side by side, each with tests in parallel.
func portLocks() string { return filepath.Join(os.TempDir(), "etcdcompat-ports") }

// freePorts reserves n distinct loopback TCP ports for the rest of t. A port
// that was merely free a moment ago may be another test's by the time a
// server binds it (CI saw etcd's peer listener lose its port to a neighbour
// test), so each port is also held by an exclusive flock on a file named
// after it until t ends: no other test, in this process or another one of
// this package, draws it meanwhile, and a server restarted on its port
// within t finds it still reserved. Ports are drawn below Linux's
// ephemeral range (32768+), so that outgoing connections, which take
// ephemeral ports, cannot grab them either.
func freePorts(t *testing.T, n int) ([]int, error) {
	if err := os.MkdirAll(portLocks(), 0o777); err != nil {
		return nil, err
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("no free loopback port found")
		}
		port := 20000 + mrand.IntN(12000)
		lock, ok := reservePort(port)
		if !ok {
			continue
		}
		t.Cleanup(func() { lock.Close() }) // registered before the servers', so it runs after their stops
		ports = append(ports, port)
	}
	return ports, nil
}

// reservePort takes port's lock and checks that nothing outside this
// package holds the port; the lock is released by closing the file.
func reservePort(port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(portLocks(), fmt.Sprint(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		f.Close()
		return nil, false
	}
	l.Close()
	return f, true
}
