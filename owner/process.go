package owner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// Process is the liveness of one process for every keyspace it owns in a
// store that many keyspaces share (package tenant). Without it, the owner
// of each keyspace rewrites its record every RenewInterval so that the
// other replicas can tell it is alive: a thousand running tenants were
// over a thousand writes a second (and twice as many reads) with no client
// doing anything, most of a process's CPU at rest on FoundationDB. With it,
// a keyspace's record names the owning process and stands still; the
// process bumps one beat key (keyspace.ProcessBeat) per interval for all
// of them, and the other replicas judge the record and the beat together:
// an owner is alive while either changes.
//
// A replica that takes a keyspace over from a process whose beat stood
// still for TTL writes the process's deposal mark (keyspace.ProcessDeposed)
// in the same transaction, and every beat reads the mark. So each takeover
// is seen by the process's first beat to commit after it: a takeover that
// committed before the beat read the mark is in what it read; one that
// committed between that read and the beat's commit makes the beat
// conflict and read again; and one that would commit after the beat read
// the beat key itself, and conflicts. A keyspace the process holds is
// therefore held until TTL after the start of the last beat that found the
// mark unchanged since the keyspace's record was last read (Elector.View):
// a takeover needs the beat to have stood still for TTL after it.
type Process struct {
	db         storage.DB
	id         uint64
	cfg        Config
	beatKey    []byte
	deposedKey []byte

	stop chan struct{}
	done chan struct{} // closed when the beats' loop returns
	once sync.Once
	ctx  context.Context
	end  context.CancelFunc

	// The electors that joined the process tick on its loop (ticks.go).
	electorsMu sync.Mutex
	electors   map[*Elector]struct{} // guarded by electorsMu
	// wake asks the tick loop to run the ticks its electors' Refresh asked
	// for; it holds at most one request.
	wake      chan struct{}
	ticksDone chan struct{} // closed when the tick loop returns

	mu        sync.Mutex
	next      uint64    // guarded by mu: the value the next beat writes
	beatStart time.Time // guarded by mu: start of the last committed beat
	mark      []byte    // guarded by mu: the deposal mark as the last beat read it
	gen       uint64    // guarded by mu: bumped when a beat finds the mark changed
}

// StartProcess beats for a new process id in the shared store db (outside
// any keyspace), at once and then every cfg.RenewInterval until Stop.
// Electors join it through Config.Process; until its first beat commits,
// their own takeovers are their renewals. They tick on its loop until
// they or it stop.
func StartProcess(db storage.DB, cfg Config) *Process {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{db: db, id: newID(), cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, end: cancel, next: 1,
		electors: make(map[*Elector]struct{}), wake: make(chan struct{}, 1), ticksDone: make(chan struct{})}
	p.beatKey, p.deposedKey = keyspace.ProcessBeat(p.id), keyspace.ProcessDeposed(p.id)
	go p.run()
	go p.tickElectors()
	return p
}

// ID is the process's id: the owner id of every record it holds.
func (p *Process) ID() uint64 { return p.id }

func (p *Process) run() {
	defer close(p.done)
	for {
		p.beat()
		p.cfg.Clock.Sleep(p.cfg.RenewInterval, p.stop, nil)
		select {
		case <-p.stop:
			return
		default:
		}
	}
}

// beat bumps the beat key and reads the deposal mark, in one transaction.
func (p *Process) beat() {
	start := p.cfg.Clock.Now()
	p.mu.Lock()
	v := binary.BigEndian.AppendUint64(nil, p.next)
	// A beat that failed may have landed (commit_unknown_result): the next
	// one writes a new value either way, so that the key keeps changing.
	p.next++
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.TTL)
	defer cancel()
	var mark []byte
	err := p.db.Update(ctx, func(tx storage.Tx) error {
		var err error
		if mark, err = tx.Get(p.deposedKey); err != nil {
			return err
		}
		tx.Set(p.beatKey, v)
		return nil
	})
	if err != nil {
		if p.ctx.Err() == nil {
			p.cfg.Logger.Warn("process beat failed", zap.Error(err))
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !bytes.Equal(mark, p.mark) {
		p.mark = mark
		p.gen++
	}
	p.beatStart = start
}

// renewal returns the start of the last committed beat (zero before the
// first) and the deposal generation: the number of changes of the mark the
// beats have found so far.
func (p *Process) renewal() (time.Time, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.beatStart, p.gen
}

// Stop ends the beats and removes the process's keys. Stop the electors
// that joined it first: they hand their keyspaces back.
func (p *Process) Stop() {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		<-p.ticksDone
		p.end()
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.TTL)
		defer cancel()
		err := p.db.Update(ctx, func(tx storage.Tx) error {
			tx.Clear(p.beatKey)
			tx.Clear(p.deposedKey)
			return nil
		})
		if err != nil {
			p.cfg.Logger.Warn("removing the process's beat", zap.Error(err))
		}
	})
}

// deposalMark is a value of a deposal mark that differs from every earlier
// one.
func deposalMark() []byte {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return b[:]
}
