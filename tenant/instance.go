package tenant

import (
	"context"
	"errors"
	"net"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/server/tlsconfig"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// acquire returns the running server of name's tenant with one more
// connection counted, starting it if needed (and creating the tenant first
// if create). Every connection looks the tenant up afresh, so a deleted
// tenant's server takes no new connection: it is stopped, and the
// connection refused (or, after the name was created again, given a server
// of the new tenant).
func (r *Router) acquire(ctx context.Context, name string, addr net.Addr, create bool) (*instance, error) {
	rec, err := r.lookup(ctx, name, create)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			r.retire(name, 0)
		}
		return nil, err
	}
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil, storage.ErrClosed
		}
		inst := r.tenants[name]
		switch {
		case inst == nil:
			inst = &instance{rec: rec, ready: make(chan struct{}), stopped: make(chan struct{}), conns: 1}
			r.tenants[name] = inst
			r.mu.Unlock()
			return inst, r.start(inst, addr)
		case inst.stopping:
			r.mu.Unlock()
			select {
			case <-inst.stopped:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case inst.rec.ID != rec.ID:
			r.mu.Unlock()
			r.retire(name, rec.ID)
		default:
			inst.conns++
			if inst.stopIdle != nil {
				inst.stopIdle()
				inst.stopIdle = nil
			}
			r.mu.Unlock()
			<-inst.ready
			return inst, inst.err
		}
	}
}

// start builds inst's server over the tenant's keyspace; on failure inst
// leaves the map and the connections waiting on it fail too.
func (r *Router) start(inst *instance, addr net.Addr) error {
	defer close(inst.ready)
	inst.l = newConnListener(addr)
	db := newDB(r.db, inst.rec.ID, inst.rec.Quotas, r.shared)
	inst.guard = newGuard(inst.rec.Name, r.metrics.label(inst.rec.Name), db, r.metrics, r.cfg.Now, r.cfg.Server.Quota.Bytes)
	inst.turns = turns{s: r.sched, tenant: inst.rec.Name}
	srv, err := server.New(r.serverConfig(inst.rec, inst.guard, inst.turns), db)
	if err != nil {
		inst.err = err
		r.mu.Lock()
		inst.stopping = true
		if r.tenants[inst.rec.Name] == inst {
			delete(r.tenants, inst.rec.Name)
		}
		r.mu.Unlock()
		close(inst.stopped)
		return err
	}
	inst.srv = srv
	inst.guard.hdr = srv.Header()
	wctx, cancel := context.WithCancel(context.Background())
	inst.unwatch, inst.watchDone = cancel, make(chan struct{})
	go r.watchLive(wctx, inst)
	srv.ServeListener(inst.l)
	r.lg.Debug("tenant server started", zap.String("tenant", inst.rec.Name))
	return nil
}

// tenantLogTailBytes bounds each running tenant's log tail in memory, and
// the values it keeps for previous values.
const tenantLogTailBytes = 1 << 20

// serverConfig is the template with the tenant's own settings: its log
// field, its quotas, which g enforces and keeps current, its bound on
// turns on the process's scheduler, and what a tenant needs less of than
// a process.
func (r *Router) serverConfig(rec Record, g *guard, tn turns) server.Config {
	sc := r.cfg.Server
	sc.Logger = r.lg.With(zap.String("tenant", rec.Name))
	sc.TLS = tlsconfig.Config{}
	sc.ListenClientURLs, sc.ListenClientHTTPURLs, sc.ListenMetricsURLs = nil, nil, nil
	// gRPC's reusable handler goroutines would be most of a quiet
	// tenant's cost (64 of its 79 goroutines, half its memory); a busy one
	// pays for growing a fresh stack per request instead.
	sc.StreamWorkers = -1
	// Likewise every method's gRPC series at zero (~400 KiB): a tenant's
	// series appear with its first call of each method.
	sc.LazyGRPCMetrics = true
	sc.SharedMembers = r.cfg.Members
	// The revisions its store keeps in memory for watch reads (mvcc's log
	// tail) are read within milliseconds of their commit by a running hub;
	// a quarter of a single keyspace's 4 MiB keeps a thousand connected
	// tenants under 1 GiB of them, and as much of the values a tenant's
	// keys last had (a single keyspace's 64 MiB) under another.
	sc.Owner = r.ownerConfig()
	sc.Owner.Process = r.process
	sc.MVCC.LogTailBytes = tenantLogTailBytes
	sc.MVCC.PrevValueBytes = tenantLogTailBytes
	if r.peers != nil {
		sc.ForwardPeers, sc.ForwardTenant = r.peers, tenantTag(rec)
	} else {
		sc.ForwardWrites = false
	}
	sc.Quota.Limit = g.bytes
	sc.GRPCOptions = append(append([]grpc.ServerOption{}, sc.GRPCOptions...), g.options()...)
	if tn.s != nil {
		sc.GRPCOptions = append(sc.GRPCOptions, grpc.ChainUnaryInterceptor(tn.unary()))
	}
	return sc
}

// release counts one connection of inst closed; the last one schedules the
// idle stop.
func (r *Router) release(inst *instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	inst.conns--
	if inst.conns > 0 || inst.stopping || r.closed {
		return
	}
	inst.stopIdle = r.cfg.AfterFunc(r.cfg.IdleTimeout, func() { r.idleStop(inst) })
}

// idleStop stops inst unless a connection came meanwhile.
func (r *Router) idleStop(inst *instance) {
	r.mu.Lock()
	if inst.conns > 0 || inst.stopping {
		r.mu.Unlock()
		return
	}
	inst.stopping = true
	inst.stopIdle = nil
	r.mu.Unlock()
	r.lg.Debug("tenant server idle: stopping", zap.String("tenant", inst.rec.Name))
	r.stop(inst, false)
}

// watchLive stops inst's server as soon as its tenant is deleted, which
// closes its connections: clients reconnect and are refused, rather than
// have every request fail with ErrDeleted on a connection that stays.
func (r *Router) watchLive(ctx context.Context, inst *instance) {
	defer close(inst.watchDone)
	live := keyspace.TenantLive(inst.rec.ID)
	// The marker carries the tenant's quotas and changes with them: each
	// change wakes the wait, which goes on from the new value while the
	// marker is there. The first wait assumes the record's quotas.
	seen, err := encodeMarker(inst.rec.Quotas)
	for seen != nil || err != nil {
		if err == nil {
			err = r.db.WaitChange(ctx, live, seen)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			seen, err = r.marker(ctx, live)
			continue
		}
		r.lg.Warn("watching a tenant's deletion", zap.String("tenant", inst.rec.Name), zap.Error(err))
		if !wait(ctx, lookupTimeout) {
			return
		}
		seen, err = r.marker(ctx, live)
	}
	r.mu.Lock()
	if inst.stopping {
		r.mu.Unlock()
		return
	}
	inst.stopping = true
	if inst.stopIdle != nil {
		inst.stopIdle()
		inst.stopIdle = nil
	}
	r.mu.Unlock()
	r.lg.Info("tenant deleted: stopping its server", zap.String("tenant", inst.rec.Name))
	r.stop(inst, true)
}

// marker reads the live marker; nil when the tenant is gone.
func (r *Router) marker(ctx context.Context, live []byte) ([]byte, error) {
	var v []byte
	err := r.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get(live)
		return err
	})
	return v, err
}

// wait waits d or until ctx ends, and reports whether it was d.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// retire stops name's server unless it serves tenant id keep.
func (r *Router) retire(name string, keep uint64) {
	r.mu.Lock()
	inst := r.tenants[name]
	if inst == nil || inst.stopping || (keep != 0 && inst.rec.ID == keep) {
		r.mu.Unlock()
		return
	}
	inst.stopping = true
	if inst.stopIdle != nil {
		inst.stopIdle()
		inst.stopIdle = nil
	}
	r.mu.Unlock()
	r.lg.Info("tenant deleted: stopping its server", zap.String("tenant", name))
	r.stop(inst, false)
}

// stop stops inst's server (its connections close with it), once inst is
// marked stopping by the caller; fromWatch says the caller is watchLive.
func (r *Router) stop(inst *instance, fromWatch bool) {
	<-inst.ready
	if inst.err != nil {
		return // never started; start closed stopped
	}
	inst.unwatch()
	if !fromWatch {
		<-inst.watchDone
	}
	inst.srv.Stop()
	r.mu.Lock()
	if r.tenants[inst.rec.Name] == inst {
		delete(r.tenants, inst.rec.Name)
	}
	r.mu.Unlock()
	close(inst.stopped)
}

// Close stops accepting, waits for connections being routed, and stops
// every tenant's server.
func (r *Router) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	var stop, wait []*instance
	for _, inst := range r.tenants {
		if inst.stopping {
			wait = append(wait, inst)
			continue
		}
		inst.stopping = true
		if inst.stopIdle != nil {
			inst.stopIdle()
			inst.stopIdle = nil
		}
		stop = append(stop, inst)
	}
	ls := r.listeners
	r.mu.Unlock()
	r.close()
	for _, l := range ls {
		_ = l.Close()
	}
	r.conns.Wait()
	r.stopPeers() // its requests hold tenants' servers: before they stop
	for _, inst := range stop {
		r.stop(inst, false)
	}
	for _, inst := range wait {
		<-inst.stopped
		if inst.watchDone != nil { // set by start, before stopped closed
			<-inst.watchDone
		}
	}
	r.process.Stop() // after every tenant's server handed its ownership back
	r.refuse.Stop()
	_ = r.refuseL.Close()
	<-r.refuseDone
	if r.peers != nil {
		r.peers.Close()
	}
	if r.admin != nil {
		r.admin.stop()
	}
}

// Running reports how many tenants have a server running.
func (r *Router) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tenants)
}
