package tenant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrInvalidQuota refuses a quota no server could apply.
var ErrInvalidQuota = errors.New("tenant: invalid quota")

// Quotas are a tenant's limits. Zero means no limit of that kind, except
// for BackendBytes, where it means the server's --quota-backend-bytes and
// a negative value no limit.
type Quotas struct {
	// BackendBytes is the tenant's --quota-backend-bytes: writes past it
	// fail with etcd's "mvcc: database space exceeded" and raise the
	// tenant's NOSPACE alarm.
	BackendBytes int64 `json:"quotaBackendBytes,omitempty"`
	// Keys bounds the tenant's keys: a Put or Txn that would create keys
	// past it fails with ErrKeyQuota.
	Keys int64 `json:"quotaKeys,omitempty"`
	// RequestsPerSecond and RequestBurst are a token bucket per tenant in
	// each replica: requests past it fail with etcd's "too many requests".
	// A burst of 0 means one second's worth of requests.
	RequestsPerSecond float64 `json:"quotaRequestsPerSecond,omitempty"`
	RequestBurst      int64   `json:"quotaRequestBurst,omitempty"`
	// Watchers bounds the tenant's open watches in each replica: a watch
	// create past it is canceled with ErrWatcherQuota.
	Watchers int64 `json:"quotaWatchers,omitempty"`
}

// Validate refuses negative limits (but for BackendBytes) and a burst
// without a rate.
func (q Quotas) Validate() error {
	switch {
	case q.Keys < 0, q.RequestsPerSecond < 0, q.RequestBurst < 0, q.Watchers < 0:
		return fmt.Errorf("%w: keys, requests per second, burst and watchers must be >= 0 (0: no limit)", ErrInvalidQuota)
	case q.RequestBurst > 0 && q.RequestsPerSecond == 0:
		return fmt.Errorf("%w: a request burst needs a rate of requests per second", ErrInvalidQuota)
	}
	return nil
}

// QuotaChange changes some of a tenant's quotas: a nil field keeps the
// tenant's own.
type QuotaChange struct {
	BackendBytes      *int64   `json:"quotaBackendBytes,omitempty"`
	Keys              *int64   `json:"quotaKeys,omitempty"`
	RequestsPerSecond *float64 `json:"quotaRequestsPerSecond,omitempty"`
	RequestBurst      *int64   `json:"quotaRequestBurst,omitempty"`
	Watchers          *int64   `json:"quotaWatchers,omitempty"`
}

// apply returns q with c's fields set.
func (c QuotaChange) apply(q Quotas) Quotas {
	set := func(dst *int64, src *int64) {
		if src != nil {
			*dst = *src
		}
	}
	set(&q.BackendBytes, c.BackendBytes)
	set(&q.Keys, c.Keys)
	set(&q.RequestBurst, c.RequestBurst)
	set(&q.Watchers, c.Watchers)
	if c.RequestsPerSecond != nil {
		q.RequestsPerSecond = *c.RequestsPerSecond
	}
	return q
}

// The live marker of a tenant (keyspace.TenantLive) holds its quotas as
// JSON: every transaction of the tenant reads the marker anyway (see
// fence), so a running server learns of a quota change from its next
// transaction, without a read, a goroutine or polling of its own. A marker
// written before quotas were kept there is empty and reads as no change.
func encodeMarker(q Quotas) ([]byte, error) {
	v, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// quotaCell is the quotas a running tenant applies, and the marker they
// were read from.
type quotaCell struct {
	cur atomic.Pointer[markedQuotas]
}

type markedQuotas struct {
	marker []byte
	q      Quotas
}

func newQuotaCell(q Quotas) *quotaCell {
	c := &quotaCell{}
	c.cur.Store(&markedQuotas{q: q})
	return c
}

// Load returns the quotas in force.
func (c *quotaCell) Load() Quotas { return c.cur.Load().q }

// observe takes a marker a transaction read: a changed, decodable one
// replaces the quotas. An undecodable marker keeps the last quotas: the
// registry writes only encodeMarker's output.
func (c *quotaCell) observe(marker []byte) {
	if len(marker) == 0 {
		return
	}
	old := c.cur.Load()
	if bytes.Equal(old.marker, marker) {
		return
	}
	var q Quotas
	if err := json.Unmarshal(marker, &q); err != nil {
		return
	}
	c.cur.CompareAndSwap(old, &markedQuotas{marker: bytes.Clone(marker), q: q})
}
