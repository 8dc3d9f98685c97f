// Package forward sends the writes a replica receives to the one replica
// that currently owns revision allocation. Every write batch reads and bumps
// the global revision, so batches committed by several replicas at once
// conflict in the backend and retry; measured on FoundationDB, three replicas
// writing together did under half the puts of one and starved one of them.
// Funnelling writes to one replica lets its sequencer group-commit them all.
//
// Ownership is only a performance hint, never a correctness condition: the
// backend's serializable transactions keep revisions dense and writes
// linearizable whoever commits them. So it needs no fencing: two replicas
// that both believe they own it for a moment merely conflict, as they would
// without forwarding.
package forward

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// ownerKey holds the current owner's record.
var ownerKey = keyspace.Singleton("writer/owner")

// Config configures a replica's part in the ownership.
type Config struct {
	// ID is this replica's member id; URL is where the others reach its
	// etcd KV service (its first advertised client URL).
	ID  uint64
	URL string
	// TTL is how long ownership lasts without renewal: the longest writes
	// keep going to an owner that died before the others take over (they
	// then fail with etcd's "leader changed" until one does). Default 3 s.
	TTL time.Duration
	// RenewInterval is how often each replica renews or checks; default TTL/4.
	RenewInterval time.Duration
	// Now is the clock; replicas' clocks must agree to well within TTL.
	Now    func() time.Time
	Logger *zap.Logger
}

func (c *Config) defaults() {
	if c.TTL <= 0 {
		c.TTL = 3 * time.Second
	}
	if c.RenewInterval <= 0 || c.RenewInterval > c.TTL/2 {
		c.RenewInterval = c.TTL / 4
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// record is the owner key's value.
type record struct {
	ID    uint64 `json:"id"`
	URL   string `json:"url"`
	Until int64  `json:"until"` // unix nanoseconds
}

// Elector keeps this replica's view of the owner current, taking ownership
// when there is none or the owner's time has run out.
type Elector struct {
	db   storage.DB
	cfg  Config
	cur  atomic.Pointer[record]
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewElector starts the election loop; Stop ends it.
func NewElector(db storage.DB, cfg Config) *Elector {
	cfg.defaults()
	e := &Elector{db: db, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	e.renew()
	go e.run()
	return e
}

func (e *Elector) run() {
	defer close(e.done)
	t := time.NewTicker(e.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.renew()
		}
	}
}

// renew renews this replica's ownership, takes it over when the recorded
// owner's time has run out, or else learns who owns it.
func (e *Elector) renew() {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewInterval)
	defer cancel()
	var got record
	err := e.db.Update(ctx, func(tx storage.Tx) error {
		cur, err := readRecord(tx)
		if err != nil {
			return err
		}
		now := e.cfg.Now().UnixNano()
		if cur != nil && cur.ID != e.cfg.ID && now < cur.Until {
			got = *cur
			return nil
		}
		got = record{ID: e.cfg.ID, URL: e.cfg.URL, Until: now + int64(e.cfg.TTL)}
		v, err := json.Marshal(got)
		if err != nil {
			return err
		}
		tx.Set(ownerKey, v)
		return nil
	})
	if err != nil {
		// Keep the last view: its Until still bounds how long it is trusted.
		e.cfg.Logger.Warn("write ownership renewal failed", zap.Error(err))
		return
	}
	if old := e.cur.Swap(&got); old == nil || old.ID != got.ID {
		e.cfg.Logger.Info("write owner", zap.Uint64("owner", got.ID), zap.String("url", got.URL),
			zap.Bool("self", got.ID == e.cfg.ID))
	}
}

func readRecord(tx storage.ReadTx) (*record, error) {
	v, err := tx.Get(ownerKey)
	if err != nil || v == nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, nil // unreadable: treat as vacant, the next renewal rewrites it
	}
	return &r, nil
}

// Owner returns the URL writes should go to, or "" when this replica should
// commit them itself: it owns them, or nobody has for a while.
func (e *Elector) Owner() string {
	r := e.cur.Load()
	if r == nil || r.ID == e.cfg.ID || e.cfg.Now().UnixNano() >= r.Until {
		return ""
	}
	return r.URL
}

// Stop ends the loop and hands ownership back, so that the next owner need
// not wait out the TTL.
func (e *Elector) Stop() {
	e.once.Do(func() {
		close(e.stop)
		<-e.done
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = e.db.Update(ctx, func(tx storage.Tx) error {
			cur, err := readRecord(tx)
			if err != nil || cur == nil || cur.ID != e.cfg.ID {
				return err
			}
			tx.Clear(ownerKey)
			return nil
		})
	})
}
