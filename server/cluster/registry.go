package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// memberPrefix starts the registry: one record per replica, keyed by its
// 8-byte big-endian member id.
var memberPrefix = keyspace.Singleton("member/")

// DefaultMemberTTL is how long a replica stays listed after its last
// heartbeat.
const DefaultMemberTTL = 10 * time.Second

// RegistryConfig describes this replica to the others.
type RegistryConfig struct {
	ID         uint64
	Name       string
	ClientURLs []string
	// TTL is how long a record lasts without renewal: a replica that dies
	// without deregistering stays listed this long. DefaultMemberTTL when 0.
	TTL time.Duration
	// Now is the clock. Records carry the writer's expiry time, read
	// against the reader's clock: a skew of d between two replicas lists a
	// dead replica d longer or shorter.
	Now    func() time.Time
	Logger *zap.Logger
}

func (c *RegistryConfig) defaults() {
	if c.TTL <= 0 {
		c.TTL = DefaultMemberTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// memberRecord is a registry value.
type memberRecord struct {
	Name       string   `json:"name"`
	ClientURLs []string `json:"clientURLs"`
	Until      int64    `json:"until"` // unix nanoseconds
}

// Registry keeps this replica's record in the store and lists the records
// that are live: every replica serving the same store, each with the client
// URLs it advertises, so that clients which sync their endpoints from
// MemberList (clientv3's AutoSyncInterval) spread over all of them.
type Registry struct {
	db   storage.DB
	cfg  RegistryConfig
	key  []byte
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewRegistry registers this replica, so that it is listed from the moment
// it serves, and keeps its record fresh until Stop.
func NewRegistry(ctx context.Context, db storage.DB, cfg RegistryConfig) (*Registry, error) {
	cfg.defaults()
	r := &Registry{db: db, cfg: cfg, key: memberKey(cfg.ID), stop: make(chan struct{}), done: make(chan struct{})}
	if err := r.heartbeat(ctx, true); err != nil {
		return nil, err
	}
	go r.run()
	return r, nil
}

func memberKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(bytes.Clone(memberPrefix), id)
}

func (r *Registry) run() {
	defer close(r.done)
	interval := r.cfg.TTL / 4
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), interval)
			if err := r.heartbeat(ctx, false); err != nil {
				r.cfg.Logger.Warn("member heartbeat failed", zap.Error(err))
			}
			cancel()
		}
	}
}

// heartbeat renews this replica's record and removes records that expired
// a TTL ago (replicas that died without deregistering). On the first one it
// warns when a live record under the same id names other URLs: two replicas
// started with the same --name.
func (r *Registry) heartbeat(ctx context.Context, first bool) error {
	now := r.cfg.Now().UnixNano()
	own := memberRecord{Name: r.cfg.Name, ClientURLs: r.cfg.ClientURLs, Until: now + int64(r.cfg.TTL)}
	v, err := json.Marshal(own)
	if err != nil {
		return err
	}
	var clash *memberRecord
	err = r.db.Update(ctx, func(tx storage.Tx) error {
		clash = nil
		kvs, err := tx.GetRange(memberPrefix, storage.Strinc(memberPrefix), storage.RangeOptions{})
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			rec, ok := decodeRecord(kv.Value)
			switch {
			case bytes.Equal(kv.Key, r.key):
				if first && ok && rec.Until > now && !slices.Equal(rec.ClientURLs, own.ClientURLs) {
					clash = &rec
				}
			case !ok || rec.Until < now-int64(r.cfg.TTL):
				tx.Clear(kv.Key)
			}
		}
		tx.Set(r.key, v)
		return nil
	})
	if err == nil && clash != nil {
		r.cfg.Logger.Warn("another live replica has this member's id; give every replica its own --name",
			zap.String("name", r.cfg.Name), zap.Strings("its-client-urls", clash.ClientURLs))
	}
	return err
}

func decodeRecord(v []byte) (memberRecord, bool) {
	var rec memberRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return rec, false
	}
	return rec, true
}

// Members lists the live replicas by id, as etcd lists its members: with
// their names and client URLs, no peer URLs (replicas have no raft peers),
// none a learner. This replica is always listed: it is answering.
func (r *Registry) Members(ctx context.Context) ([]*pb.Member, error) {
	var kvs []storage.KeyValue
	err := r.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		kvs, err = tx.GetRange(memberPrefix, storage.Strinc(memberPrefix), storage.RangeOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	now := r.cfg.Now().UnixNano()
	self := &pb.Member{ID: r.cfg.ID, Name: r.cfg.Name, ClientURLs: r.cfg.ClientURLs}
	out := []*pb.Member{self}
	for _, kv := range kvs {
		rec, ok := decodeRecord(kv.Value)
		if !ok || rec.Until <= now || len(kv.Key) != len(r.key) {
			continue
		}
		id := binary.BigEndian.Uint64(kv.Key[len(memberPrefix):])
		if id != r.cfg.ID {
			out = append(out, &pb.Member{ID: id, Name: rec.Name, ClientURLs: rec.ClientURLs})
		}
	}
	slices.SortFunc(out, func(a, b *pb.Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out, nil
}

// Stop ends the heartbeats and removes this replica's record, so that it
// leaves the list at once rather than after its TTL.
func (r *Registry) Stop() {
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := r.db.Update(ctx, func(tx storage.Tx) error {
			tx.Clear(r.key)
			return nil
		}); err != nil {
			r.cfg.Logger.Warn("member deregistration failed; it stays listed until its TTL runs out", zap.Error(err))
		}
	})
}
