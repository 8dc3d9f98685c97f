// Package alarm keeps etcd's alarms (NOSPACE, CORRUPT) in the store, under
// one key, so that every replica sharing the store sees the same alarms and
// they survive restarts, as etcd's alarms survive in its backend. It answers
// what etcd's apply layer answers for Maintenance.Alarm.
//
// Replicas learn of changes made elsewhere by waiting on the key
// (storage.DB.WaitChange, a FoundationDB watch), so the write path can ask
// Active without a storage read.
package alarm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// key holds every alarm and the outcomes of the latest changes.
var key = keyspace.Singleton("alarms")

// keptOutcomes is how many change outcomes the key remembers: a change whose
// commit was reported unknown (FoundationDB's 1021) finds its own outcome on
// retry there, however many changes other replicas made in between, up to
// this many.
const keptOutcomes = 32

// retryDelay paces the follower after a storage error.
const retryDelay = time.Second

// record is the key's value.
type record struct {
	Alarms   []entry   `json:"alarms"`
	Outcomes []outcome `json:"outcomes,omitempty"`
}

type entry struct {
	Member uint64       `json:"member"`
	Alarm  pb.AlarmType `json:"alarm"`
}

// outcome is what one Activate or Deactivate did.
type outcome struct {
	Nonce uint64 `json:"nonce"`
	Hit   bool   `json:"hit"`
}

// Store is the alarms of one store, with a cached copy that follows it.
type Store struct {
	db storage.DB
	lg *zap.Logger

	mu     sync.Mutex
	alarms []entry // guarded by mu; the latest alarms read or written

	cancel context.CancelFunc
	done   chan struct{}
}

// Open reads the alarms and starts following the key; Stop ends that.
func Open(ctx context.Context, db storage.DB, lg *zap.Logger) (*Store, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	s := &Store{db: db, lg: lg, done: make(chan struct{})}
	raw, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.follow(fctx, raw)
	return s, nil
}

// Stop ends the follower.
func (s *Store) Stop() {
	s.cancel()
	<-s.done
}

// follow re-reads the key whenever it changes.
func (s *Store) follow(ctx context.Context, seen []byte) {
	defer close(s.done)
	for ctx.Err() == nil {
		if err := s.db.WaitChange(ctx, key, seen); err != nil {
			if ctx.Err() != nil || errors.Is(err, storage.ErrClosed) {
				return
			}
			s.lg.Warn("waiting for alarm changes", zap.Error(err))
			sleep(ctx, retryDelay)
			continue
		}
		raw, err := s.read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.lg.Warn("reading alarms", zap.Error(err))
				sleep(ctx, retryDelay)
			}
			continue
		}
		seen = raw
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// read loads the key and updates the cache; it returns the raw value.
func (s *Store) read(ctx context.Context) ([]byte, error) {
	var raw []byte
	err := s.db.View(ctx, func(tx storage.ReadTx) error {
		v, err := tx.Get(key)
		raw = v
		return err
	})
	if err != nil {
		return nil, err
	}
	s.set(decode(raw).Alarms)
	return raw, nil
}

func (s *Store) set(alarms []entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alarms = alarms
}

// decode reads a record; an unreadable one counts as no alarms, so that a
// damaged key cannot block writes forever (the next change rewrites it).
func decode(raw []byte) record {
	var r record
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &r)
	}
	return r
}

// Active reports whether an alarm of type t is raised by any member, as the
// cached copy has it.
func (s *Store) Active(t pb.AlarmType) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.alarms {
		if e.Alarm == t {
			return true
		}
	}
	return false
}

// Raised reports whether member has raised an alarm of type t, as the
// cached copy has it.
func (s *Store) Raised(member uint64, t pb.AlarmType) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.alarms, entry{Member: member, Alarm: t})
}

// Cached lists the alarms of type t (every type for NONE) from the cached
// copy, ordered by type, then member.
func (s *Store) Cached(t pb.AlarmType) []*pb.AlarmMember {
	s.mu.Lock()
	defer s.mu.Unlock()
	return members(s.alarms, t)
}

// List reads the alarms of type t (every type for NONE) from the store.
func (s *Store) List(ctx context.Context, t pb.AlarmType) ([]*pb.AlarmMember, error) {
	if _, err := s.read(ctx); err != nil {
		return nil, err
	}
	return s.Cached(t), nil
}

func members(alarms []entry, t pb.AlarmType) []*pb.AlarmMember {
	var out []*pb.AlarmMember
	for _, e := range alarms {
		if t == pb.AlarmType_NONE || e.Alarm == t {
			out = append(out, &pb.AlarmMember{MemberID: e.Member, Alarm: e.Alarm})
		}
	}
	return out
}

// Activate raises alarm t for member and returns it, whether or not it was
// raised already, as etcd does; NONE raises nothing and returns nil.
func (s *Store) Activate(ctx context.Context, member uint64, t pb.AlarmType) (*pb.AlarmMember, error) {
	if t == pb.AlarmType_NONE {
		return nil, nil
	}
	if _, err := s.change(ctx, entry{Member: member, Alarm: t}, true); err != nil {
		return nil, err
	}
	return &pb.AlarmMember{MemberID: member, Alarm: t}, nil
}

// Deactivate clears alarm t of member. It returns the alarm it cleared, or
// nil when member had no such alarm.
func (s *Store) Deactivate(ctx context.Context, member uint64, t pb.AlarmType) (*pb.AlarmMember, error) {
	hit, err := s.change(ctx, entry{Member: member, Alarm: t}, false)
	if err != nil || !hit {
		return nil, err
	}
	return &pb.AlarmMember{MemberID: member, Alarm: t}, nil
}

// change adds (raise) or removes e. hit reports whether e was there before.
// The transaction may run again after a commit whose outcome was unknown;
// it then finds its nonce among the outcomes and answers what the commit
// did instead of applying the change a second time.
func (s *Store) change(ctx context.Context, e entry, raise bool) (hit bool, err error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return false, err
	}
	nonce := binary.BigEndian.Uint64(b[:])
	var after []entry
	err = s.db.Update(ctx, func(tx storage.Tx) error {
		raw, err := tx.Get(key)
		if err != nil {
			return err
		}
		r := decode(raw)
		after = r.Alarms
		if i := slices.IndexFunc(r.Outcomes, func(o outcome) bool { return o.Nonce == nonce }); i >= 0 {
			hit = r.Outcomes[i].Hit
			return nil
		}
		i := slices.Index(r.Alarms, e)
		hit = i >= 0
		switch {
		case raise && !hit:
			r.Alarms = insertSorted(r.Alarms, e)
		case !raise && hit:
			r.Alarms = slices.Delete(slices.Clone(r.Alarms), i, i+1)
		}
		r.Outcomes = append(r.Outcomes, outcome{Nonce: nonce, Hit: hit})
		if n := len(r.Outcomes); n > keptOutcomes {
			r.Outcomes = r.Outcomes[n-keptOutcomes:]
		}
		v, err := json.Marshal(r)
		if err != nil {
			return err
		}
		tx.Set(key, v)
		after = r.Alarms
		return nil
	})
	if err != nil {
		return false, err
	}
	s.set(after)
	return hit, nil
}

func insertSorted(alarms []entry, e entry) []entry {
	out := append(slices.Clone(alarms), e)
	slices.SortFunc(out, func(a, b entry) int {
		if a.Alarm != b.Alarm {
			return int(a.Alarm) - int(b.Alarm)
		}
		switch {
		case a.Member < b.Member:
			return -1
		case a.Member > b.Member:
			return 1
		}
		return 0
	})
	return out
}
