package snapimport

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fdb-etcd/fdb-etcd/lease"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// snapLease is one record of etcd's lease bucket.
type snapLease struct {
	id, ttl, remaining int64
}

// decodeLease reads etcd's leasepb.Lease{ID: 1, TTL: 2, RemainingTTL: 3},
// all int64 varints.
func decodeLease(b []byte) (snapLease, error) {
	var l snapLease
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return l, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return l, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return l, protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 1:
			l.id = int64(v)
		case 2:
			l.ttl = int64(v)
		case 3:
			l.remaining = int64(v)
		}
	}
	return l, nil
}

// loadLeases writes the lease bucket's leases, cfg.LeaseBatch per
// transaction, before any key so that keys find their leases to attach to.
// As etcd's lessor restores a lease, it has its checkpointed remaining TTL
// when one was recorded and its whole TTL otherwise, counted from now.
func loadLeases(ctx context.Context, db storage.DB, lb *bolt.Bucket, cfg Config) (int, error) {
	if lb == nil {
		return 0, nil
	}
	total := 0
	var batch []snapLease
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		now := cfg.Now()
		err := db.Update(ctx, func(tx storage.Tx) error {
			for _, l := range batch {
				remaining := l.ttl
				if l.remaining > 0 {
					remaining = l.remaining
				}
				if err := lease.WriteImported(tx, l.id, l.ttl, now.Add(time.Duration(remaining)*time.Second)); err != nil {
					return err
				}
			}
			return nil
		})
		total += len(batch)
		batch = batch[:0]
		return err
	}
	err := lb.ForEach(func(k, v []byte) error {
		l, err := decodeLease(v)
		if err != nil {
			return fmt.Errorf("snapimport: lease %x: %w", k, err)
		}
		batch = append(batch, l)
		if len(batch) >= cfg.LeaseBatch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	if err := flush(); err != nil {
		return total, err
	}
	cfg.Logger.Sugar().Infof("imported %d leases", total)
	return total, nil
}
