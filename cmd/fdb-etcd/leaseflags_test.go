package main

import (
	"testing"
	"time"
)

func TestLeaseTimingFlags(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		minTTL int64
		extend time.Duration
		fails  bool
	}{
		{nil, 2, time.Second, false}, // etcd's defaults: 100 ms / 1 s
		{[]string{"--heartbeat-interval=500", "--election-timeout=5000"}, 8, 5 * time.Second, false},
		{[]string{"--heartbeat-interval=100", "--election-timeout=2500"}, 4, 2500 * time.Millisecond, false},
		{[]string{"--heartbeat-interval=300", "--election-timeout=1000"}, 0, 0, true},
		{[]string{"--heartbeat-interval=0"}, 0, 0, true},
	} {
		c, err := parseServer(tc.args)
		if tc.fails {
			if err == nil {
				t.Errorf("%v: accepted", tc.args)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.Lease.MinTTL != tc.minTTL || c.Lease.Extend != tc.extend {
			t.Errorf("%v: min TTL %d extend %v, want %d %v", tc.args, c.Lease.MinTTL, c.Lease.Extend, tc.minTTL, tc.extend)
		}
	}
}
