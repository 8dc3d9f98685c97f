package robustness

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/tests/v3/robustness/traffic"
)

type trafficProfile struct {
	name    string
	traffic traffic.Traffic
	profile traffic.Profile
}

// profiles are etcd's own robustness traffic profiles (scenarios.go):
// etcd's KV traffic with leases and deletes, and Kubernetes' (unique
// revisions), each with watch and compaction traffic.
func profiles() []trafficProfile {
	kv := traffic.KeyValueMedium
	if long {
		kv = traffic.KeyValueHigh
	}
	return []trafficProfile{
		{"EtcdTrafficDeleteLeases", traffic.EtcdPutDeleteLease, traffic.Profile{KeyValue: &kv, Watch: &traffic.WatchDefault, Compaction: &traffic.CompactionDefault}},
		{"KubernetesTraffic", traffic.Kubernetes, traffic.Profile{KeyValue: &kv, Watch: &traffic.WatchDefault, Compaction: &traffic.CompactionDefault}},
	}
}

func span(short, longer time.Duration) time.Duration {
	if long {
		return longer
	}
	return short
}

// TestRobustness drives fdb-etcd (the real binary, embedded backend, on
// loopback) with etcd's robustness traffic under each fault and validates
// every run with etcd's validators: linearizability of the KV history
// (porcupine, etcd's model), every watch guarantee, and serializable reads,
// against the requests fdb-etcd persisted.
func TestRobustness(t *testing.T) {
	type fault struct {
		name       string
		fp         failpoint
		serverArgs []string
		compaction *traffic.Compaction
	}
	faults := []fault{
		{name: "NoFault", fp: noFailpoint{span(4*time.Second, 30*time.Second)}},
		{name: "Kill9Restart", fp: killFailpoint{kills: int(span(2, 3))}},
		{name: "StorageFaults", fp: noFailpoint{span(4*time.Second, 30*time.Second)},
			// Every transaction may be retried or reported
			// commit-unknown after committing, reads fail as too old, and
			// the transaction clock jumps past the 5 s limit every 2 s.
			serverArgs: []string{"--experimental-storage-faults=retry=0.2,unknown=0.2,tooold=0.02,agejump=2s"}},
		{name: "Kill9UnderStorageFaults", fp: killFailpoint{kills: int(span(2, 3))},
			serverArgs: []string{"--experimental-storage-faults=retry=0.1,unknown=0.2,tooold=0.01,agejump=3s"}},
		{name: "StalledWatchCompaction", fp: stalledWatchFailpoint{streams: 4, stall: span(4*time.Second, 20*time.Second)},
			compaction: &traffic.CompactionFrequent},
	}
	for _, f := range faults {
		for _, p := range profiles() {
			if !long && !shortPair(f.name, p.name) {
				continue
			}
			t.Run(f.name+"/"+p.name, func(t *testing.T) {
				prof := p.profile
				if f.compaction != nil {
					prof.Compaction = f.compaction
				}
				runScenario(t, scenario{
					name: f.name + "/" + p.name, traffic: p.traffic, profile: prof,
					serverArgs: f.serverArgs, failpoint: f.fp,
					before: span(2*time.Second, 10*time.Second), after: span(2*time.Second, 10*time.Second),
					minSuccesses: int(span(200, 2000)),
					control:      f.name == "NoFault",
				})
			})
		}
	}
}

// shortPair picks, for make test, one traffic profile per fault, alternating
// so both profiles run.
func shortPair(fault, profile string) bool {
	switch fault {
	case "NoFault", "StorageFaults":
		return strings.HasPrefix(profile, "Kubernetes")
	case "Kill9UnderStorageFaults":
		return false // long runs only
	default:
		return strings.HasPrefix(profile, "Etcd")
	}
}

// TestZSummary prints what the runs above validated (it runs last).
func TestZSummary(t *testing.T) {
	outcomesMu.Lock()
	defer outcomesMu.Unlock()
	if len(outcomes) == 0 {
		t.Skip("no robustness runs")
	}
	sort.Slice(outcomes, func(i, j int) bool { return outcomes[i].scenario < outcomes[j].scenario })
	var b strings.Builder
	var ops, events int
	for _, o := range outcomes {
		ops += o.kvOps
		events += o.watchEvents
		fmt.Fprintf(&b, "\n  %-50s %6d KV ops (%d failed) %7d watch events  rev %-6d  lin=%s watch=%s ser=%s  failpoint: %s",
			o.scenario, o.kvOps, o.kvFailed, o.watchEvents, o.maxRev, o.linearization, o.watch, o.seri, o.failpoint)
		if len(o.faults) > 0 {
			fmt.Fprintf(&b, "  fault counters: %v", o.faults)
		}
	}
	t.Logf("robustness: %d scenarios validated, %d KV operations, %d watch events:%s", len(outcomes), ops, events, b.String())
}
