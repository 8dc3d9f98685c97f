package watch_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// readLimitDB holds every read transaction to the bytes FoundationDB could
// serve it within its 5 s limit (at a conservative 10 MB/s), failing a
// larger one with transaction_too_old (1007) as FoundationDB would. The
// backend's retry loop then runs it again, as FoundationDB's does.
type readLimitDB struct {
	storage.DB
	max int
}

const fdbReadableBytes = 50_000_000

func (d *readLimitDB) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	return d.DB.View(ctx, func(tx storage.ReadTx) error {
		return fn(&readLimitTx{ReadTx: tx, max: d.max})
	})
}

type readLimitTx struct {
	storage.ReadTx
	max, n int
}

func (t *readLimitTx) account(n int) error {
	t.n += n
	if t.n > t.max {
		return fmt.Errorf("%d bytes read in one transaction: %w", t.n, storage.ErrTransactionTooOld)
	}
	return nil
}

func (t *readLimitTx) Get(key []byte) ([]byte, error) {
	if t.n > t.max {
		return nil, storage.ErrTransactionTooOld
	}
	v, err := t.ReadTx.Get(key)
	if err != nil {
		return nil, err
	}
	return v, t.account(len(key) + len(v))
}

func (t *readLimitTx) GetMany(keys [][]byte) ([][]byte, error) {
	if t.n > t.max {
		return nil, storage.ErrTransactionTooOld
	}
	vs, err := t.ReadTx.GetMany(keys)
	if err != nil {
		return nil, err
	}
	n := 0
	for i := range vs {
		n += len(keys[i]) + len(vs[i])
	}
	return vs, t.account(n)
}

func (t *readLimitTx) GetRange(begin, end []byte, opt storage.RangeOptions) ([]storage.KeyValue, error) {
	if t.n > t.max {
		return nil, storage.ErrTransactionTooOld
	}
	kvs, err := t.ReadTx.GetRange(begin, end, opt)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, kv := range kvs {
		n += len(kv.Key) + len(kv.Value)
	}
	return kvs, t.account(n)
}

// bigWrite is one acknowledged write of the test.
type bigWrite struct {
	key     string
	rev     int64
	sum     [32]byte // of the value; zero for a delete
	started time.Time
}

func bigValue(i int) []byte {
	v := make([]byte, 1_400_000)
	for j := 0; j+8 <= len(v); j += 4096 {
		binary.BigEndian.PutUint64(v[j:], uint64(i)<<32|uint64(j))
	}
	return v
}

// Issue 13 item 6: values of 1.4 MiB written at up to 200/s while 100
// watchers (single keys and prefixes, with and without prev_kv) watch them,
// two more replay them from the first write, then one DeleteRange whose
// previous values are 14 MB: every watcher gets exactly its events, with
// the right values and previous values, and no storage transaction reads
// more than FoundationDB could within its time limit. The revision log used
// to be read 256 revisions at a time, values and previous values included,
// in one transaction that could never finish in time.
func TestLargeValuesReachEveryWatcher(t *testing.T) {
	db := &readLimitDB{DB: testdb.Open(t), max: fdbReadableBytes}
	s := testserver.Start(t, testserver.Options{DB: db, Config: server.Config{}})
	const keys, writes, rate = 100, 200, 200
	base := rev(t, s.Client)
	clients := make([]*clientv3.Client, 4)
	for i := range clients {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Addr}, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	live := []*watchSpec{{key: "big/", prefix: true}, {key: "big/1", prefix: true, prevKV: true}}
	for i := 0; i < 98; i++ {
		live = append(live, &watchSpec{key: fmt.Sprintf("big/%02d", i), prevKV: i%4 == 0})
	}
	for i, sp := range live {
		sp.open(ctx, clients[i%len(clients)], 0)
	}
	start := time.Now()
	log := writeBig(t, ctx, clients[0], keys, writes, rate)
	took := time.Since(start)
	late := []*watchSpec{{key: "big/2", prefix: true, prevKV: true}, {key: "big/07", prevKV: true}}
	for i, sp := range late {
		sp.open(ctx, clients[i], base+1)
	}
	del, err := clients[0].Delete(ctx, "big/0", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	log = append(log, deletes(log, "big/0", del.Header.Revision)...)
	var lat []time.Duration
	for _, sp := range append(live, late...) {
		lat = append(lat, sp.check(t, log)...)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(time.Millisecond) }
	t.Logf("%s: %d writes of 1.4 MiB in %v, then a delete of 10 of them, to %d watchers; latency from a write's start to its event at live watchers: p50 %v p99 %v max %v; everything delivered %v after the first write",
		testdb.Backend(), writes, took.Round(time.Millisecond), len(live)+len(late), q(0.5), q(0.99), q(1), time.Since(start).Round(time.Millisecond))
}

// writeBig puts bigValue(i) to big/<i%keys> for i < writes, at most rate a
// second, from a few concurrent writers, and returns the writes in revision
// order.
func writeBig(t *testing.T, ctx context.Context, c *clientv3.Client, keys, writes, rate int) []bigWrite {
	t.Helper()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	next := make(chan int)
	go func() {
		defer close(next)
		for i := 0; i < writes; i++ {
			<-tick.C
			next <- i
		}
	}()
	var mu sync.Mutex
	var log []bigWrite
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				k, v := fmt.Sprintf("big/%02d", i%keys), bigValue(i)
				started := time.Now()
				r, err := c.Put(ctx, k, string(v))
				if err != nil {
					t.Errorf("put %s: %v", k, err)
					continue
				}
				mu.Lock()
				log = append(log, bigWrite{key: k, rev: r.Header.Revision, sum: sha256.Sum256(v), started: started})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	sort.Slice(log, func(i, j int) bool { return log[i].rev < log[j].rev })
	return log
}

// deletes are the events of one DeleteRange at rev over the keys written
// with the given prefix.
func deletes(log []bigWrite, prefix string, rev int64) []bigWrite {
	seen := map[string]bool{}
	var out []bigWrite
	for _, w := range log {
		if strings.HasPrefix(w.key, prefix) && !seen[w.key] {
			seen[w.key] = true
			out = append(out, bigWrite{key: w.key, rev: rev})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// seenEvent is what a watcher received, without the values themselves.
type seenEvent struct {
	desc         string // "PUT key@rev"
	sum, prevSum [32]byte
	hasPrev      bool
	at           time.Time
}

// watchSpec is one watcher of the test: its goroutine receives as events
// arrive (keeping only their digests) until the test's context ends.
type watchSpec struct {
	key            string
	prefix, prevKV bool
	start          int64

	mu      sync.Mutex
	seen    []seenEvent
	err     error
	arrived chan struct{} // signalled after each response
}

func (sp *watchSpec) open(ctx context.Context, c *clientv3.Client, start int64) {
	opts := []clientv3.OpOption{clientv3.WithRev(start), clientv3.WithCreatedNotify()}
	if sp.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if sp.prevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	sp.start, sp.arrived = start, make(chan struct{}, 1)
	ch := c.Watch(ctx, sp.key, opts...)
	<-ch // created
	go sp.collect(ch)
}

func (sp *watchSpec) collect(ch clientv3.WatchChan) {
	for resp := range ch {
		at := time.Now()
		sp.mu.Lock()
		if err := resp.Err(); err != nil && sp.err == nil {
			sp.err = err
		}
		for _, ev := range resp.Events {
			se := seenEvent{desc: fmt.Sprintf("%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision), at: at}
			if ev.Type == clientv3.EventTypePut {
				se.sum = sha256.Sum256(ev.Kv.Value)
			}
			if ev.PrevKv != nil {
				se.prevSum, se.hasPrev = sha256.Sum256(ev.PrevKv.Value), true
			}
			sp.seen = append(sp.seen, se)
		}
		sp.mu.Unlock()
		select {
		case sp.arrived <- struct{}{}:
		default:
		}
	}
}

func (sp *watchSpec) holds(key string) bool {
	return key == sp.key || sp.prefix && strings.HasPrefix(key, sp.key)
}

// await returns the first n events received, failing after d.
func (sp *watchSpec) await(t *testing.T, n int, d time.Duration) []seenEvent {
	t.Helper()
	deadline := time.After(d)
	for {
		sp.mu.Lock()
		seen, err := sp.seen, sp.err
		sp.mu.Unlock()
		switch {
		case err != nil:
			t.Fatalf("watch %s: %v after %d events", sp.key, err, len(seen))
		case len(seen) >= n:
			return seen
		}
		select {
		case <-sp.arrived:
		case <-deadline:
			t.Fatalf("watch %s from %d: %d of %d events within %v", sp.key, sp.start, len(seen), n, d)
		}
	}
}

// check compares what the watcher received with what log says it must get;
// it returns the write-to-event latency of a live watcher.
func (sp *watchSpec) check(t *testing.T, log []bigWrite) []time.Duration {
	t.Helper()
	var want []bigWrite
	for _, w := range log {
		if sp.holds(w.key) {
			want = append(want, w)
		}
	}
	seen := sp.await(t, len(want), 2*time.Minute)
	if len(seen) != len(want) {
		t.Fatalf("watch %s: %d events, want %d", sp.key, len(seen), len(want))
	}
	prev := map[string][32]byte{}
	var lat []time.Duration
	for i, w := range log {
		last, had := prev[w.key]
		prev[w.key] = w.sum
		if !sp.holds(w.key) {
			continue
		}
		got := seen[0]
		seen = seen[1:]
		typ := "PUT"
		if w.sum == ([32]byte{}) {
			typ = "DELETE"
		}
		switch want := fmt.Sprintf("%s %s@%d", typ, w.key, w.rev); {
		case got.desc != want:
			t.Fatalf("watch %s: event %d is %s, want %s", sp.key, i, got.desc, want)
		case got.sum != w.sum:
			t.Fatalf("watch %s: %s with a wrong value", sp.key, got.desc)
		case sp.prevKV && had && (!got.hasPrev || got.prevSum != last):
			t.Fatalf("watch %s: %s without its previous value", sp.key, got.desc)
		case !sp.prevKV && got.hasPrev:
			t.Fatalf("watch %s: %s with a previous value not asked for", sp.key, got.desc)
		}
		if sp.start == 0 && !w.started.IsZero() {
			lat = append(lat, got.at.Sub(w.started))
		}
	}
	return lat
}
