package tenant

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// bucket is the token bucket of the request quota. Its tokens are counted
// for one rate and burst: a changed quota starts a full bucket.
type bucket struct {
	mu     sync.Mutex
	tokens float64   // guarded by mu
	at     time.Time // guarded by mu: when tokens was counted
	rate   float64   // guarded by mu
	burst  float64   // guarded by mu
}

// take takes a token at now, and reports whether there was one; a rate of
// 0 is no limit.
func (b *bucket) take(now time.Time, rate float64, burst int64) bool {
	if rate <= 0 {
		return true
	}
	capacity := float64(burst)
	if burst <= 0 {
		capacity = max(1, rate)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() || b.rate != rate || b.burst != capacity {
		b.tokens, b.at, b.rate, b.burst = capacity, now, rate, capacity
	}
	if d := now.Sub(b.at); d > 0 { // a clock that steps back adds nothing
		b.tokens = min(capacity, b.tokens+d.Seconds()*rate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// keyCountRefresh is how long a count of the tenant's keys is used before
// the next write that checks the key quota counts them again.
const keyCountRefresh = time.Second

// keyCount is the key quota's count of the tenant's keys. Counting reads
// every key (a count-only Range), so it is done at most once per
// keyCountRefresh, and only for tenants with a key quota. Between counts,
// a write far from the quota is admitted and its keys counted as if all
// were new; near the quota, its keys are looked up and only the new ones
// counted, and a write that would pass the quota on a count inflated by
// such guesses counts again before it is refused.
type keyCount struct {
	mu      sync.Mutex
	n       int64     // guarded by mu: keys at readAt, plus the creations admitted since
	guessed int64     // guarded by mu: of those, counted as new without a look-up
	readAt  time.Time // guarded by mu; zero: never counted
}

// admit admits a write of keys under a quota of limit keys, or refuses it
// with ErrKeyQuota.
func (k *keyCount) admit(ctx context.Context, kv pb.KVServer, limit int64, keys [][]byte, now time.Time) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.readAt.IsZero() || now.Sub(k.readAt) >= keyCountRefresh {
		if err := k.count(ctx, kv, now); err != nil {
			return err
		}
	}
	if k.n+int64(len(keys)) <= limit {
		k.n += int64(len(keys))
		k.guessed += int64(len(keys))
		return nil
	}
	fresh, err := newKeys(ctx, kv, keys)
	if err != nil {
		return err
	}
	if k.n+fresh > limit && k.guessed > 0 {
		if err := k.count(ctx, kv, now); err != nil {
			return err
		}
	}
	if k.n+fresh > limit {
		return ErrKeyQuota
	}
	k.n += fresh
	return nil
}

// count counts the tenant's keys.
func (k *keyCount) count(ctx context.Context, kv pb.KVServer, now time.Time) error {
	resp, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, CountOnly: true})
	if err != nil {
		return err
	}
	k.n, k.guessed, k.readAt = resp.Count, 0, now
	return nil
}

// newKeys counts the keys that do not exist yet.
func newKeys(ctx context.Context, kv pb.KVServer, keys [][]byte) (int64, error) {
	var n int64
	for _, key := range keys {
		resp, err := kv.Range(ctx, &pb.RangeRequest{Key: key, CountOnly: true})
		if err != nil {
			return 0, err
		}
		if resp.Count == 0 {
			n++
		}
	}
	return n, nil
}

// putKeys are the distinct keys a Put or Txn may create: a Txn's puts of
// both branches and of nested transactions, since which branch runs is
// known only once it runs.
func putKeys(req any) [][]byte {
	seen := map[string]bool{}
	var out [][]byte
	add := func(k []byte) {
		if len(k) > 0 && !seen[string(k)] { // an empty key is the service's to refuse
			seen[string(k)] = true
			out = append(out, k)
		}
	}
	var walk func(ops []*pb.RequestOp)
	walk = func(ops []*pb.RequestOp) {
		for _, op := range ops {
			if p := op.GetRequestPut(); p != nil {
				add(p.Key)
			} else if t := op.GetRequestTxn(); t != nil {
				walk(t.Success)
				walk(t.Failure)
			}
		}
	}
	switch r := req.(type) {
	case *pb.PutRequest:
		add(r.Key)
	case *pb.TxnRequest:
		walk(r.Success)
		walk(r.Failure)
	}
	return out
}
