// Package freeport hands tests loopback addresses for servers that another
// process (a built binary, an fdbserver) will bind a moment later.
//
// The usual trick, listening on port 0 and closing the listener, returns a
// port from the kernel's ephemeral range. Once it is closed, any outgoing
// connection on the machine (a FoundationDB client, a gRPC dial, another
// test) may take it as its source port before the child binds it, and the
// child fails with "address already in use". Ports outside that range are
// never given out as source ports, so only another caller picking the same
// port at random can race, and Addrs never returns one twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// rangeFile is where Linux keeps the ephemeral (source) port range.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Linux's default range, used where rangeFile cannot be read.
const defaultLow, defaultHigh = 32768, 60999

// lowest is the first port handed out: below it live well-known and
// registered services a developer may be running.
const lowest = 10000

// attempts bounds the random probes before Addrs gives up on a port.
const attempts = 200

// Addr returns one loopback address ("127.0.0.1:port") that was free a
// moment ago and lies outside the ephemeral port range.
func Addr() (string, error) {
	a, err := Addrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}

// Addrs returns n distinct such addresses.
func Addrs(n int) ([]string, error) {
	low, high := ephemeralRange()
	candidates := outside(low, high)
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	out := make([]string, 0, n)
	for range n {
		l, err := probe(candidates)
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// portSet is the ports a caller may use: [lowest, low) and (high, 65535].
type portSet struct{ below, above [2]int }

func outside(low, high int) portSet {
	return portSet{below: [2]int{lowest, max(lowest, low)}, above: [2]int{min(high+1, 65536), 65536}}
}

func (s portSet) size() int { return s.below[1] - s.below[0] + s.above[1] - s.above[0] }

func (s portSet) at(i int) int {
	if n := s.below[1] - s.below[0]; i >= n {
		return s.above[0] + i - n
	}
	return s.below[0] + i
}

func probe(s portSet) (net.Listener, error) {
	n := s.size()
	if n == 0 {
		return nil, fmt.Errorf("freeport: no port outside the ephemeral range")
	}
	var last error
	for range attempts {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.at(rand.IntN(n))))
		if err == nil {
			return l, nil
		}
		last = err
	}
	return nil, fmt.Errorf("freeport: %d ports tried: %w", attempts, last)
}

func ephemeralRange() (low, high int) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return defaultLow, defaultHigh
	}
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil || low > high {
		return defaultLow, defaultHigh
	}
	return low, high
}
