package tenant

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/fdb-etcd/fdb-etcd/keyspace"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// MaxNameBytes bounds a tenant name (a certificate's Common Name is at most
// 64 characters; room is left for names given by hand).
const MaxNameBytes = 256

var (
	ErrNotFound    = errors.New("tenant: not found")
	ErrExists      = errors.New("tenant: already exists")
	ErrInvalidName = errors.New("tenant: invalid name")
)

// Record is a tenant as the registry stores it.
type Record struct {
	Name string `json:"-"`
	ID   uint64 `json:"id"`
	Quotas
	// Token tells the creating call its own record from a concurrent
	// creator's after a commit whose outcome was unknown.
	Token uint64 `json:"token"`
}

// Registry is the set of tenants, stored in the shared store's root
// keyspace.
type Registry struct {
	db storage.DB
}

// NewRegistry returns the registry of db.
func NewRegistry(db storage.DB) *Registry { return &Registry{db: db} }

// ValidName reports whether name can name a tenant: non-empty UTF-8
// without control characters, at most MaxNameBytes.
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameBytes || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %q", ErrInvalidName, name)
		}
	}
	return nil
}

func decode(name string, v []byte) (Record, error) {
	r := Record{Name: name}
	if err := json.Unmarshal(v, &r); err != nil {
		return r, fmt.Errorf("tenant %q: bad record: %w", name, err)
	}
	return r, nil
}

// Get returns the tenant named name, or ErrNotFound.
func (g *Registry) Get(ctx context.Context, name string) (Record, error) {
	var v []byte
	err := g.db.View(ctx, func(tx storage.ReadTx) error {
		var err error
		v, err = tx.Get(keyspace.TenantRecord(name))
		return err
	})
	if err != nil {
		return Record{}, err
	}
	if v == nil {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return decode(name, v)
}

// Create adds the tenant named name with a fresh id and a byte quota (see
// Quotas.BackendBytes), or fails with ErrExists.
func (g *Registry) Create(ctx context.Context, name string, quotaBytes int64) (Record, error) {
	return g.CreateWithQuotas(ctx, name, Quotas{BackendBytes: quotaBytes})
}

// CreateWithQuotas adds the tenant named name with a fresh id and quotas
// q, or fails with ErrExists. Retries after an unknown commit result find
// their own record.
func (g *Registry) CreateWithQuotas(ctx context.Context, name string, q Quotas) (Record, error) {
	if err := ValidName(name); err != nil {
		return Record{}, err
	}
	if err := q.Validate(); err != nil {
		return Record{}, err
	}
	var tok [8]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return Record{}, err
	}
	rec := Record{Name: name, Quotas: q, Token: binary.BigEndian.Uint64(tok[:])}
	err := g.db.Update(ctx, func(tx storage.Tx) error {
		v, err := tx.Get(keyspace.TenantRecord(name))
		if err != nil {
			return err
		}
		if v != nil {
			old, err := decode(name, v)
			if err == nil && old.Token == rec.Token {
				rec = old // an earlier attempt of this call committed
				return nil
			}
			return fmt.Errorf("%w: %q", ErrExists, name)
		}
		last, err := tx.Get(keyspace.TenantLastID)
		if err != nil {
			return err
		}
		rec.ID = 1
		if len(last) == 8 {
			rec.ID = binary.BigEndian.Uint64(last) + 1
		}
		return put(tx, rec, true)
	})
	return rec, err
}

// put writes rec and its live marker, which carries its quotas (see
// encodeMarker), and with fresh its id.
func put(tx storage.Tx, rec Record, fresh bool) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	marker, err := encodeMarker(rec.Quotas)
	if err != nil {
		return err
	}
	tx.Set(keyspace.TenantRecord(rec.Name), v)
	tx.Set(keyspace.TenantLive(rec.ID), marker)
	if fresh {
		tx.Set(keyspace.TenantLastID, binary.BigEndian.AppendUint64(nil, rec.ID))
	}
	return nil
}

// SetQuota changes a tenant's byte quota (see ChangeQuotas).
func (g *Registry) SetQuota(ctx context.Context, name string, quotaBytes int64) (Record, error) {
	return g.ChangeQuotas(ctx, name, QuotaChange{BackendBytes: &quotaBytes})
}

// ChangeQuotas changes the quotas c names and keeps the others. Running
// servers of the tenant apply them from their next transaction on: the
// quotas travel in the live marker that every transaction reads.
func (g *Registry) ChangeQuotas(ctx context.Context, name string, c QuotaChange) (Record, error) {
	var rec Record
	err := g.db.Update(ctx, func(tx storage.Tx) error {
		v, err := tx.Get(keyspace.TenantRecord(name))
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if rec, err = decode(name, v); err != nil {
			return err
		}
		rec.Quotas = c.apply(rec.Quotas)
		if err := rec.Quotas.Validate(); err != nil {
			return err
		}
		return put(tx, rec, false)
	})
	return rec, err
}

// Delete removes the tenant and all its data in one transaction: a range
// clear of its prefix is small on both backends whatever the data's size.
// Its live marker goes with it, so any transaction still running for the
// tenant fails (see DB). The id is never handed out again.
func (g *Registry) Delete(ctx context.Context, name string) error {
	rec, err := g.Get(ctx, name)
	if err != nil {
		return err
	}
	return g.db.Update(ctx, func(tx storage.Tx) error {
		v, err := tx.Get(keyspace.TenantRecord(name))
		if err != nil {
			return err
		}
		if v == nil {
			return nil // deleted, by an earlier attempt of this call or another
		}
		cur, err := decode(name, v)
		if err != nil {
			return err
		}
		if cur.ID != rec.ID {
			return nil // deleted and created again meanwhile: not ours to delete
		}
		p := keyspace.TenantPrefix(rec.ID)
		tx.ClearRange(p, storage.Strinc(p))
		tx.Clear(keyspace.TenantLive(rec.ID))
		tx.Clear(keyspace.TenantRecord(name))
		return nil
	})
}

// listPage bounds the records one View of List reads.
const listPage = 500

// List returns every tenant in name order, a page per transaction.
func (g *Registry) List(ctx context.Context) ([]Record, error) {
	var out []Record
	from, end := keyspace.TenantRecords()
	for {
		var page []storage.KeyValue
		err := g.db.View(ctx, func(tx storage.ReadTx) error {
			var err error
			page, err = tx.GetRange(from, end, storage.RangeOptions{Limit: listPage})
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, kv := range page {
			name, err := keyspace.TenantName(kv.Key)
			if err != nil {
				return nil, err
			}
			rec, err := decode(name, kv.Value)
			if err != nil {
				return nil, err
			}
			out = append(out, rec)
		}
		if len(page) < listPage {
			return out, nil
		}
		from = append(bytes.Clone(page[len(page)-1].Key), 0)
	}
}
