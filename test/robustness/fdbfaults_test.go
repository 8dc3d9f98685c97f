package robustness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/fdbserver"
)

// fdbFault is one FoundationDB failure injected while the traffic runs. Each
// also kills, while FoundationDB is failing, the fdb-etcd replica that owns
// revision allocation (r0, started first) and the lease keyspace's expiry
// owner, and restarts them once FoundationDB answers again.
type fdbFault struct {
	name string
	// args are extra replica flags.
	args []string
	// outage: FoundationDB itself stops answering, so every replica must
	// report itself not ready meanwhile.
	outage bool
	run    func(ctx context.Context, f *fdbTarget) (string, error)
}

// restartAfter is how long a killed process stays down.
const restartAfter = 3 * time.Second

func fdbFaults() []fdbFault {
	return []fdbFault{
		{name: "KillStorage", run: killProcess("storage", "log", "master", "cluster_controller")},
		{name: "KillLog", run: killProcess("log", "master", "cluster_controller")},
		{name: "KillClusterController", run: killProcess("cluster_controller")},
		{name: "ForcedRecovery", run: forcedRecoveries(int(span(2, 4)), 4*time.Second)},
		{name: "PauseProcess", run: pauseProcess("log", 10*time.Second)},
		{name: "ClusterRestart", outage: true, run: clusterRestart(4 * time.Second)},
		{name: "ClientBuggify", run: replicaKillOnly(5 * time.Second),
			args: []string{"--fdb-client-buggify", "--fdb-client-buggify-section-activated-probability", "100",
				"--fdb-client-buggify-section-fired-probability", "5"}},
	}
}

// pickProcess returns a process holding role, preferring the one that holds
// the fewest of avoid, then the fewest roles, and the roles it holds.
func pickProcess(st fdbserver.Status, role string, avoid ...string) (int, []string) {
	best, bestRoles, bestScore := -1, []string(nil), 0
	for _, i := range st.Roles[role] {
		var roles []string
		score := 0
		for r, ps := range st.Roles {
			if slices.Contains(ps, i) {
				roles = append(roles, r)
				if slices.Contains(avoid, r) {
					score += 100
				}
				score++
			}
		}
		if best < 0 || score < bestScore {
			best, bestRoles, bestScore = i, roles, score
		}
	}
	slices.Sort(bestRoles)
	return best, bestRoles
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// killProcess kills -9 a process holding role (avoiding others where it
// can) and restarts it after restartAfter.
func killProcess(role string, avoid ...string) func(ctx context.Context, f *fdbTarget) (string, error) {
	return func(ctx context.Context, f *fdbTarget) (string, error) {
		st, err := f.cluster.Status(ctx)
		if err != nil {
			return "", err
		}
		i, roles := pickProcess(st, role, avoid...)
		if i < 0 {
			return "", fmt.Errorf("no process holds %s: %v", role, st.Roles)
		}
		f.note(evFault)
		if err := f.cluster.Kill(i); err != nil {
			return "", err
		}
		killed := f.killReplicas()
		if err := sleepCtx(ctx, restartAfter); err != nil {
			return "", err
		}
		if err := f.cluster.Restart(i); err != nil {
			return "", err
		}
		f.note(evHealed)
		if err := f.heal(ctx, killed); err != nil {
			return "", err
		}
		return fmt.Sprintf("kill -9 fdbserver %s (%s), restarted after %v; fdb-etcd %s killed meanwhile",
			f.cluster.Addr(i), strings.Join(roles, ","), restartAfter, names(killed)), nil
	}
}

// forcedRecoveries forces n recoveries (fdbcli kill; kill all), every apart.
func forcedRecoveries(n int, every time.Duration) func(ctx context.Context, f *fdbTarget) (string, error) {
	return func(ctx context.Context, f *fdbTarget) (string, error) {
		var killed []*server
		for i := range n {
			if i > 0 {
				if err := sleepCtx(ctx, every); err != nil {
					return "", err
				}
			}
			f.note(evFault)
			if i == 0 {
				killed = f.killReplicas()
			}
			if err := f.cluster.ForceRecovery(ctx); err != nil {
				return "", err
			}
			f.note(evHealed)
			if err := f.waitAvailable(ctx); err != nil {
				return "", err
			}
			if i == 0 {
				if err := f.heal(ctx, killed); err != nil {
					return "", err
				}
			}
		}
		return fmt.Sprintf("%d forced recoveries (fdbcli kill; kill all, every process restarted) %v apart; fdb-etcd %s killed during the first",
			n, every, names(killed)), nil
	}
}

// pauseProcess stops a process holding role with SIGSTOP for d.
func pauseProcess(role string, d time.Duration) func(ctx context.Context, f *fdbTarget) (string, error) {
	return func(ctx context.Context, f *fdbTarget) (string, error) {
		st, err := f.cluster.Status(ctx)
		if err != nil {
			return "", err
		}
		i, roles := pickProcess(st, role, "master", "cluster_controller")
		if i < 0 {
			return "", fmt.Errorf("no process holds %s: %v", role, st.Roles)
		}
		f.note(evFault)
		if err := f.cluster.Pause(i); err != nil {
			return "", err
		}
		killed := f.killReplicas()
		if err := sleepCtx(ctx, d); err != nil {
			_ = f.cluster.Resume(i)
			return "", err
		}
		if err := f.cluster.Resume(i); err != nil {
			return "", err
		}
		f.note(evHealed)
		if err := f.heal(ctx, killed); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGSTOP fdbserver %s (%s) for %v, then SIGCONT; fdb-etcd %s killed meanwhile",
			f.cluster.Addr(i), strings.Join(roles, ","), d, names(killed)), nil
	}
}

// clusterRestart kills every fdbserver at once and starts them again after
// down.
func clusterRestart(down time.Duration) func(ctx context.Context, f *fdbTarget) (string, error) {
	return func(ctx context.Context, f *fdbTarget) (string, error) {
		f.note(evFault)
		f.cluster.KillAll()
		killed := f.killReplicas()
		if err := sleepCtx(ctx, down); err != nil {
			return "", err
		}
		if err := f.cluster.RestartAll(); err != nil {
			return "", err
		}
		f.note(evHealed)
		if err := f.heal(ctx, killed); err != nil {
			return "", err
		}
		return fmt.Sprintf("all %d fdbservers killed at once, restarted after %v; fdb-etcd %s killed meanwhile",
			f.cluster.Size(), down, names(killed)), nil
	}
}

// replicaKillOnly leaves FoundationDB alone (client buggify injects the
// faults) and kills the replicas halfway through d.
func replicaKillOnly(d time.Duration) func(ctx context.Context, f *fdbTarget) (string, error) {
	return func(ctx context.Context, f *fdbTarget) (string, error) {
		if err := sleepCtx(ctx, d/2); err != nil {
			return "", err
		}
		f.note(evFault)
		killed := f.killReplicas()
		if err := sleepCtx(ctx, restartAfter); err != nil {
			return "", err
		}
		f.note(evHealed)
		if err := f.heal(ctx, killed); err != nil {
			return "", err
		}
		if err := sleepCtx(ctx, d/2); err != nil {
			return "", err
		}
		return fmt.Sprintf("client buggify on every replica for the whole run; fdb-etcd %s killed and restarted", names(killed)), nil
	}
}

// killReplicas kills the revision owner (r0) and the lease keyspace's
// expiry owner.
func (f *fdbTarget) killReplicas() []*server {
	killed := []*server{f.replicas[0], f.leaseOwner()}
	for _, s := range killed {
		f.killReplica(s)
	}
	return killed
}

// heal waits until FoundationDB answers and restarts the killed replicas.
func (f *fdbTarget) heal(ctx context.Context, killed []*server) error {
	if err := f.waitAvailable(ctx); err != nil {
		return err
	}
	for _, s := range killed {
		if err := s.start(); err != nil {
			return err
		}
	}
	return nil
}

// leaseOwner is the lease replica that says it owns lease expiry (the first
// when none says so).
func (f *fdbTarget) leaseOwner() *server {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, s := range f.leases {
		resp, err := client.Get("http://" + s.endpoint() + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "\nfdb_etcd_lease_expiry_owner 1\n") {
			return s
		}
	}
	return f.leases[0]
}

func names(ss []*server) string {
	var out []string
	for _, s := range ss {
		out = append(out, s.name())
	}
	return strings.Join(out, " and ")
}
