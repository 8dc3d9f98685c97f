package fdbserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// pollInterval is how often the Wait methods ask fdbcli again.
const pollInterval = 200 * time.Millisecond

// Status is the part of `status json` the tests use.
type Status struct {
	// Available: the database accepts transactions; Healthy: and nothing is
	// degraded (client.database_status).
	Available, Healthy bool
	// RecoveryState is the cluster's recovery state (fully_recovered once a
	// recovery has ended and every log is recruited).
	RecoveryState string
	// DataHealthy: every shard has its full replication.
	DataHealthy bool
	// Generation grows with every recovery.
	Generation int64
	// Roles maps a role (master, cluster_controller, log, storage,
	// commit_proxy, grv_proxy, resolver, coordinator, ...) to the indices
	// of the processes holding it.
	Roles map[string][]int
	// Reporting is the indices of the processes status knows of.
	Reporting []int
}

type statusJSON struct {
	Client struct {
		DatabaseStatus struct {
			Available bool `json:"available"`
			Healthy   bool `json:"healthy"`
		} `json:"database_status"`
	} `json:"client"`
	Cluster struct {
		Generation    int64 `json:"generation"`
		RecoveryState struct {
			Name string `json:"name"`
		} `json:"recovery_state"`
		Data struct {
			State struct {
				Healthy bool `json:"healthy"`
			} `json:"state"`
		} `json:"data"`
		Processes map[string]struct {
			Address string `json:"address"`
			Roles   []struct {
				Role string `json:"role"`
			} `json:"roles"`
		} `json:"processes"`
	} `json:"cluster"`
}

// Status reads `status json`. While the cluster cannot answer it, the
// result says unavailable rather than failing.
func (c *Cluster) Status(ctx context.Context) (Status, error) {
	out, err := c.cli(ctx, "status json", 10)
	if ctx.Err() != nil {
		return Status{}, ctx.Err()
	}
	var raw statusJSON
	if start := strings.IndexByte(out, '{'); start >= 0 {
		if jerr := json.Unmarshal([]byte(out[start:]), &raw); jerr != nil && err == nil {
			err = jerr
		}
	}
	st := Status{
		Available:     raw.Client.DatabaseStatus.Available,
		Healthy:       raw.Client.DatabaseStatus.Healthy,
		RecoveryState: raw.Cluster.RecoveryState.Name,
		DataHealthy:   raw.Cluster.Data.State.Healthy,
		Generation:    raw.Cluster.Generation,
		Roles:         map[string][]int{},
	}
	byAddr := map[string]int{}
	for i, p := range c.procs {
		byAddr[p.addr] = i
	}
	for _, p := range raw.Cluster.Processes {
		i, ok := byAddr[p.Address]
		if !ok {
			continue
		}
		st.Reporting = append(st.Reporting, i)
		for _, r := range p.Roles {
			st.Roles[r.Role] = append(st.Roles[r.Role], i)
		}
	}
	if len(st.Reporting) == 0 && err != nil {
		return st, fmt.Errorf("status json: %w: %s", err, truncate(out, 500))
	}
	return st, nil
}

// RoleHolder returns the index of a process holding role (the first, for
// roles several processes hold), asking status until one is reported.
func (c *Cluster) RoleHolder(ctx context.Context, role string) (int, error) {
	for {
		st, err := c.Status(ctx)
		if err == nil {
			if ps := st.Roles[role]; len(ps) > 0 {
				return ps[0], nil
			}
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return 0, fmt.Errorf("no process holds role %s: %w", role, err)
		}
	}
}

// WaitAvailable returns once the database accepts transactions again.
func (c *Cluster) WaitAvailable(ctx context.Context) error {
	return c.cliUntil(ctx, "status minimal", "The database is available")
}

// WaitHealthy returns once the database is available and fully recovered,
// every shard is fully replicated, and every running process reports.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var last Status
	for {
		st, err := c.Status(ctx)
		if err == nil && st.Available && st.RecoveryState == "fully_recovered" && st.DataHealthy && c.allReporting(st) {
			return nil
		}
		last = st
		if err := c.exitedUnasked(); err != nil {
			return err
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return fmt.Errorf("cluster not healthy (last status: available %v, recovery %q, data healthy %v, %d of %d processes): %w",
				last.Available, last.RecoveryState, last.DataHealthy, len(last.Reporting), len(c.procs), err)
		}
	}
}

func (c *Cluster) allReporting(st Status) bool {
	seen := map[int]bool{}
	for _, i := range st.Reporting {
		seen[i] = true
	}
	for i, p := range c.procs {
		if p.running() && !seen[i] {
			return false
		}
	}
	return true
}

// exitedUnasked fails when a process has exited without being told to:
// the waits would otherwise run into their deadlines.
func (c *Cluster) exitedUnasked() error {
	for _, p := range c.procs {
		if p.failed() {
			return errors.New(p.exitReport())
		}
	}
	return nil
}

// cli runs one fdbcli --exec command with fdbcli's own timeout in seconds.
func (c *Cluster) cli(ctx context.Context, command string, timeout int) (string, error) {
	cmd := exec.CommandContext(ctx, c.cliBin, "--cluster-file", c.clusterFile,
		"--timeout", strconv.Itoa(timeout), "--exec", command)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// cliUntil runs command until its output contains one of wants.
func (c *Cluster) cliUntil(ctx context.Context, command string, wants ...string) error {
	var last string
	for {
		out, _ := c.cli(ctx, command, 10)
		last = out
		for _, w := range wants {
			if strings.Contains(out, w) {
				return nil
			}
		}
		if err := c.exitedUnasked(); err != nil {
			return err
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return fmt.Errorf("fdbcli --exec %q: none of %q: %w; last output: %s", command, wants, err, truncate(last, 1000))
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
