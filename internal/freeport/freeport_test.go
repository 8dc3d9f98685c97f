package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsAreOutsideTheEphemeralRangeAndDistinct(t *testing.T) {
	low, high := ephemeralRange()
	addrs, err := Addrs(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		host, p, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q: %v", a, err)
		}
		port, _ := strconv.Atoi(p)
		if port >= low && port <= high || port < lowest {
			t.Fatalf("port %d is inside the ephemeral range %d–%d or below %d", port, low, high, lowest)
		}
		if seen[a] {
			t.Fatalf("%s returned twice", a)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("returned address %s cannot be bound: %v", a, err)
		}
		l.Close()
	}
}

func TestPortSet(t *testing.T) {
	s := outside(32768, 60999)
	if got, want := s.size(), 32768-lowest+65535-60999; got != want {
		t.Fatalf("size %d, want %d", got, want)
	}
	if s.at(0) != lowest || s.at(32768-lowest-1) != 32767 || s.at(32768-lowest) != 61000 || s.at(s.size()-1) != 65535 {
		t.Fatalf("at: %d %d %d %d", s.at(0), s.at(32768-lowest-1), s.at(32768-lowest), s.at(s.size()-1))
	}
	if s := outside(1024, 65535); s.size() != 0 {
		t.Fatalf("a range covering every port leaves %d", s.size())
	}
}
