package forward_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/fdb-etcd/fdb-etcd/internal/testdb"
	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/owner"
	"github.com/fdb-etcd/fdb-etcd/server"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// shared lets several in-process servers use one store: each server closes
// its store on Stop, and the others must outlive it.
type shared struct{ storage.DB }

func (shared) Close() error { return nil }

func start(t *testing.T, db storage.DB, name string) *testserver.Server {
	t.Helper()
	return testserver.Start(t, testserver.Options{DB: shared{db}, Config: server.Config{
		Name:          name,
		ForwardWrites: true,
		Owner:         owner.Config{TTL: time.Second},
	}})
}

// forwarded reads s's fdb_etcd_forward_writes_total{result=result}.
func forwarded(t *testing.T, s *testserver.Server, result string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^fdb_etcd_forward_writes_total\{result="` + result + `"\} (\d+)$`).FindSubmatch(scrapeHandler(t, s.Server))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// scrapeHandler reads s's metrics through its handler, whatever its TLS.
func scrapeHandler(t *testing.T, s *server.Server) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	s.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.Bytes()
}

// metricValue reads one series' value from a scrape, 0 if absent.
func metricValue(text, series string) int {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\d+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestWritesGoToTheOwner: the first replica owns revision allocation; the
// second sends it its writes (and only its writes), passes its etcd errors
// through unchanged, and takes over once the owner stops.
func TestWritesGoToTheOwner(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, "a")
	b := start(t, db, "b")
	c := ctx(t)

	// b learns the owner on start; writes wait for its connection to a.
	deadline := time.Now().Add(10 * time.Second)
	for forwarded(t, b, "ok") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never forwarded a write to a")
		}
		if _, err := b.Client.Put(c, "warmup", "x"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ok0 := forwarded(t, b, "ok")

	put, err := b.Client.Put(c, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.MemberId != b.Header().MemberID {
		t.Errorf("forwarded put's header names member %x, want b's %x", put.Header.MemberId, b.Header().MemberID)
	}
	get, err := a.Client.Get(c, "k")
	if err != nil || len(get.Kvs) != 1 || get.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("a sees k = %v, %v; want it at b's put revision %d", get, err, put.Header.Revision)
	}
	txn, err := b.Client.Txn(c).If(clientv3.Compare(clientv3.Value("k"), "=", "v1")).
		Then(clientv3.OpPut("k", "v2"), clientv3.OpGet("k")).Commit()
	if err != nil || !txn.Succeeded || txn.Header.Revision != put.Header.Revision+1 {
		t.Fatalf("txn = %+v, %v", txn, err)
	}
	if _, err := b.Client.Delete(c, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Client.Txn(c).Then(clientv3.OpGet("k")).Commit(); err != nil {
		t.Fatal(err) // read-only: served by b itself
	}
	if got := forwarded(t, b, "ok") - ok0; got != 3 {
		t.Errorf("b forwarded %d writes, want 3 (put, txn, delete; not the read-only txn)", got)
	}
	if n := forwarded(t, a, "ok"); n != 0 {
		t.Errorf("a, the owner, forwarded %d writes", n)
	}

	// The owner's etcd errors come back as they are.
	_, err = b.Client.Put(c, "leased", "v", clientv3.WithLease(12345))
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("put with an unknown lease through b = %v, want %v", err, rpctypes.ErrLeaseNotFound)
	}
	if forwarded(t, b, "error") != 1 {
		t.Errorf("the owner's error was not counted as forwarded with result error")
	}

	// When a stops it hands ownership back; b commits its own writes.
	a.Stop()
	before := forwarded(t, b, "ok")
	deadline = time.Now().Add(10 * time.Second)
	for {
		resp, err := b.Client.Put(c, "after", "x")
		if err == nil && forwarded(t, b, "ok") == before {
			get, err := b.Client.Get(c, "after")
			if err != nil || len(get.Kvs) != 1 || get.Kvs[0].ModRevision != resp.Header.Revision {
				t.Fatalf("after a stopped: get = %v, %v", get, err)
			}
			break
		}
		if err != nil && !errors.Is(err, rpctypes.ErrLeaderChanged) {
			t.Fatalf("put through b after a stopped: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("b still forwards (or fails) 10 s after the owner stopped")
		}
		before = forwarded(t, b, "ok")
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFirstWritesWaitForTheOwnerConnection: a replica's first writes, sent
// at once by many clients, wait for its connection to the owner instead of
// committing locally, where they would race the owner's commits on the head
// revision (and, under load, lose until their deadline).
func TestFirstWritesWaitForTheOwnerConnection(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, "a")
	if _, err := a.Client.Put(ctx(t), "ready", "x"); err != nil {
		t.Fatal(err)
	}
	b := start(t, db, "b") // reads the owner record as it starts
	c := ctx(t)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Client.Put(c, fmt.Sprintf("first/%d", i), "v"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok, local := forwarded(t, b, "ok"), forwarded(t, b, "local"); ok != 16 || local != 0 {
		t.Fatalf("b's first 16 writes: %d forwarded, %d committed locally; want 16 and 0", ok, local)
	}
}

// warm writes through b until b has forwarded one write to the owner.
func warm(t *testing.T, b *testserver.Server) {
	t.Helper()
	c := ctx(t)
	deadline := time.Now().Add(10 * time.Second)
	for forwarded(t, b, "ok") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never forwarded a write to the owner")
		}
		if _, err := b.Client.Put(c, "warmup", "x"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRevokeCompactAndNestedTxnGoToTheOwner: every request that commits
// through the sequencer goes to the owner, not only Put, DeleteRange and
// flat writing Txns: LeaseRevoke, Compact, and a Txn whose only op is a
// nested read-only Txn (a write by etcd's rule, which mvcc's write path
// follows; forwarding must agree).
func TestRevokeCompactAndNestedTxnGoToTheOwner(t *testing.T) {
	db := testdb.Open(t)
	a := start(t, db, "a")
	b := start(t, db, "b")
	c := ctx(t)
	warm(t, b)
	l, err := b.Client.Grant(c, 60)
	if err != nil {
		t.Fatal(err)
	}
	put, err := b.Client.Put(c, "held", "v", clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	ok0 := forwarded(t, b, "ok")
	rv, err := b.Client.Revoke(c, l.ID)
	if err != nil || rv.Header.Revision != put.Header.Revision+1 {
		t.Fatalf("revoke through b = %v, %v; want revision %d", rv, err, put.Header.Revision+1)
	}
	if _, err := b.Client.Revoke(c, l.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("second revoke through b = %v, want the owner's %v", err, rpctypes.ErrLeaseNotFound)
	}
	if _, err := b.Client.Compact(c, rv.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.Get(c, "held", clientv3.WithRev(put.Header.Revision)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read below the compaction on a = %v, want %v", err, rpctypes.ErrCompacted)
	}
	nested, err := b.Client.Txn(c).Then(clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpGet("k")}, nil)).Commit()
	if err != nil || !nested.Succeeded || nested.Header.Revision != rv.Header.Revision {
		t.Fatalf("nested read-only txn = %v, %v; want no new revision", nested, err)
	}
	if got := forwarded(t, b, "ok") - ok0; got != 3 {
		t.Errorf("b forwarded %d of revoke, compact and nested txn, want 3", got)
	}
	if got := forwarded(t, b, "error"); got != 1 {
		t.Errorf("b counted %d owner errors, want 1 (the second revoke)", got)
	}
	if n := forwarded(t, a, "ok"); n != 0 {
		t.Errorf("a, the owner, forwarded %d writes", n)
	}
}

// failing fails, while armed, every transaction that writes a storage key
// containing marker, with err; other transactions go through.
type failing struct {
	storage.DB
	marker []byte
	err    atomic.Pointer[error]
}

func (f *failing) Update(ctx context.Context, fn func(storage.Tx) error) error {
	return f.DB.Update(ctx, func(tx storage.Tx) error {
		w := &watchedTx{Tx: tx, marker: f.marker}
		if err := fn(w); err != nil {
			return err
		}
		if e := f.err.Load(); e != nil && w.hit {
			return *e
		}
		return nil
	})
}

type watchedTx struct {
	storage.Tx
	marker []byte
	hit    bool
}

func (w *watchedTx) Set(key, value []byte) {
	w.hit = w.hit || bytes.Contains(key, w.marker)
	w.Tx.Set(key, value)
}

// TestOwnerFailuresPassThrough: a failure the owner answers is the owner's
// answer, known not to have committed; a forwarding replica reports it as
// the owner would have, not as "leader changed" (whose outcome is unknown).
func TestOwnerFailuresPassThrough(t *testing.T) {
	db := testdb.Open(t)
	fa := &failing{DB: shared{db}, marker: []byte("refused-by-storage")}
	a := testserver.Start(t, testserver.Options{DB: fa, Config: server.Config{
		Name: "a", ForwardWrites: true, Owner: owner.Config{TTL: time.Second}}})
	b := start(t, db, "b")
	warm(t, b)
	c := ctx(t)
	tooLarge := storage.ErrTransactionTooLarge
	fa.err.Store(&tooLarge)
	_, direct := a.Client.Put(c, "refused-by-storage", "v")
	_, through := b.Client.Put(c, "refused-by-storage", "v")
	fa.err.Store(nil)
	if direct == nil {
		t.Fatal("the owner accepted the write its storage refuses")
	}
	if errors.Is(through, rpctypes.ErrLeaderChanged) {
		t.Fatalf("b reported the owner's refusal (%v) as %v", direct, through)
	}
	ds, ts := status.Convert(direct), status.Convert(through)
	if ds.Code() != ts.Code() || ds.Message() != ts.Message() {
		t.Fatalf("through b: %v; the owner itself answers %v", through, direct)
	}
	if r, err := a.Client.Get(c, "refused-by-storage"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the refused write is there: %v, %v", r, err)
	}
}
