package fdbetcd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Replicas are fdb-etcd processes sharing one keyspace of a FoundationDB
// cluster, as production runs them: any of them serves any request, and
// writes go to whichever owns revision allocation at the time.
type Replicas struct {
	Servers []*Server
	Prefix  string
	opts    []Options
}

// StartReplicas starts n replicas on the cluster f in a fresh keyspace, in
// parallel, and waits until each answers.
func StartReplicas(f *FDB, n int, o Options) (*Replicas, error) {
	r := &Replicas{Prefix: "conformance-" + randHex(6), Servers: make([]*Server, n)}
	for i := 0; i < n; i++ {
		ro := o
		ro.Name = fmt.Sprintf("replica-%d", i)
		ro.FDBClusterFile, ro.FDBPrefix = f.ClusterFile, r.Prefix
		if o.DataDir != "" {
			ro.DataDir = fmt.Sprintf("%s-%d", o.DataDir, i)
			ro.LogPath = ro.DataDir + ".log"
		}
		r.opts = append(r.opts, ro)
	}
	if err := r.startAll(); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

func (r *Replicas) startAll() error {
	errs := make([]error, len(r.opts))
	var wg sync.WaitGroup
	for i := range r.opts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Servers[i], errs[i] = Start(r.opts[i])
			if errs[i] == nil {
				// A restart reuses the port and the data directory.
				r.opts[i].Port, r.opts[i].DataDir, r.opts[i].LogPath = r.Servers[i].Port, r.Servers[i].DataDir, r.Servers[i].LogPath
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// URLs are the replicas' client URLs, for --etcd-servers or a client.
func (r *Replicas) URLs() []string {
	var out []string
	for _, s := range r.Servers {
		if s != nil {
			out = append(out, s.URL)
		}
	}
	return out
}

// Stop stops every replica (SIGTERM, then SIGKILL after 10 s).
func (r *Replicas) Stop() {
	var wg sync.WaitGroup
	for _, s := range r.Servers {
		if s != nil {
			wg.Add(1)
			go func() { defer wg.Done(); s.Stop() }()
		}
	}
	wg.Wait()
}

// Restart stops every replica and starts each again on its port.
func (r *Replicas) Restart() error {
	r.Stop()
	return r.startAll()
}

// Logs returns the tails of the replicas' logs, n bytes each.
func (r *Replicas) Logs(n int) string {
	var b strings.Builder
	for i, s := range r.Servers {
		if s == nil {
			continue
		}
		log, _ := os.ReadFile(s.LogPath)
		fmt.Fprintf(&b, "--- replica %d (%s):\n%s\n", i, s.LogPath, tail(string(log), n))
	}
	return b.String()
}

// StartReplicasT starts replicas for one test; they stop when it ends, and
// their logs are printed in part when it failed.
func StartReplicasT(t testing.TB, f *FDB, n int, o Options) *Replicas {
	t.Helper()
	r, err := StartReplicas(f, n, o)
	if err != nil {
		t.Fatalf("starting %d fdb-etcd replicas on FoundationDB: %v", n, err)
	}
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("fdb-etcd replica logs (tails):\n%s", r.Logs(3000))
			return
		}
		for _, s := range r.Servers {
			os.RemoveAll(s.DataDir)
			os.Remove(s.LogPath)
		}
	})
	return r
}

// Kill stops replica i at once (SIGKILL), as a crash would.
func (r *Replicas) Kill(i int) { r.Servers[i].Kill() }

// Restart1 starts replica i again on its port and data directory after
// Kill or Stop; the port may linger a moment after the old process.
func (r *Replicas) Restart1(i int) error {
	var err error
	for try := 0; try < 20; try++ {
		var s *Server
		if s, err = Start(r.opts[i]); err == nil {
			r.Servers[i] = s
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}
