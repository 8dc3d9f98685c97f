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
	"time"
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
// within t finds it still reserved. Ports are drawn below the machine's
// ephemeral range (ip_local_port_range; Linux's default starts at 32768),
// so that outgoing connections, which take ephemeral ports, cannot grab
// them either.
func freePorts(t *testing.T, n int) ([]int, error) {
	if err := os.MkdirAll(portLocks(), 0o777); err != nil {
		return nil, err
	}
	low, high := 20000, min(32000, ephemeralLow())
	if high-low < 1000 {
		return nil, fmt.Errorf("the ephemeral port range starts at %d: too few ports below it from %d", high, low)
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("no free loopback port found")
		}
		port := low + mrand.IntN(high-low)
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

// ephemeralLow is the first port Linux hands out as a source port, or its
// default where the setting cannot be read.
func ephemeralLow() int {
	var low, high int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		_, err = fmt.Sscan(string(b), &low, &high)
	}
	if err != nil || low > high {
		return 32768
	}
	return low
}

// TestEmbeddedEtcdWaitsForItsReservedPort holds a reserved port for a
// moment, as a stopping etcd or a passing connection would, and requires
// the reference etcd to start on it once it is released.
func TestEmbeddedEtcdWaitsForItsReservedPort(t *testing.T) {
	t.Parallel()
	ports, err := freePorts(t, 2)
	if err != nil {
		t.Fatal(err)
	}
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(time.Second, func() { held.Close() })
	defer release.Stop()
	_, stop, err := startEmbedded(t, "etcd", ports[0], ports[1], pairOptions{})
	if err != nil {
		t.Fatalf("etcd on a port released after a second: %v", err)
	}
	stop()
}
