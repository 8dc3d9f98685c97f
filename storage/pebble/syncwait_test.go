package pebble_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/fdb-etcd/fdb-etcd/storage"
)

// gatedFS holds WAL syncs while armed: the first one to start is
// reported on syncing, and every one waits for release.
type gatedFS struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	syncing chan struct{}
	release chan struct{}
}

func (g *gatedFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, c)
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &gatedFile{File: f, g: g}, nil
}

func (g *gatedFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.ReuseForWrite(oldname, newname, c)
	if err != nil || !strings.HasSuffix(newname, ".log") {
		return f, err
	}
	return &gatedFile{File: f, g: g}, nil
}

func (g *gatedFS) wait() {
	g.mu.Lock()
	armed := g.armed
	if armed {
		select {
		case <-g.syncing:
		default:
			close(g.syncing)
		}
	}
	g.mu.Unlock()
	if armed {
		<-g.release
	}
}

type gatedFile struct {
	vfs.File
	g *gatedFS
}

func (f *gatedFile) Sync() error                  { f.g.wait(); return f.File.Sync() }
func (f *gatedFile) SyncData() error              { f.g.wait(); return f.File.SyncData() }
func (f *gatedFile) SyncTo(n int64) (bool, error) { f.g.wait(); return f.File.SyncTo(n) }

// TestUpdateRunsWhileAnotherSyncs: an Update does not wait for the WAL
// sync of the Update before it, only for its writes to be applied, so
// concurrent Updates (every tenant and the lessor share the store) join
// one sync instead of queueing behind each other's. Each still returns
// only once its own writes are durable.
func TestUpdateRunsWhileAnotherSyncs(t *testing.T) {
	g := &gatedFS{FS: vfs.NewMem(), syncing: make(chan struct{}), release: make(chan struct{})}
	o := testOptions
	o.FS = g
	db := open(t, "db", o)
	var releaseOnce sync.Once
	releaseSyncs := func() { releaseOnce.Do(func() { close(g.release) }) }
	t.Cleanup(func() { releaseSyncs(); db.Close() }) // a failed test must not leave an Update held
	set := func(k string) func(storage.Tx) error {
		return func(tx storage.Tx) error { tx.Set([]byte(k), []byte("v")); return nil }
	}
	if err := db.Update(ctx(t), set("warm")); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()

	first := make(chan error, 1)
	go func() { first <- db.Update(ctx(t), set("first")) }()
	<-g.syncing // the first Update's writes are applied; its sync is held

	ran := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		second <- db.Update(ctx(t), func(tx storage.Tx) error {
			close(ran)
			v, err := tx.Get([]byte("first"))
			if err == nil && v == nil {
				t.Error("the second Update does not see the first one's write")
			}
			return set("second")(tx)
		})
	}()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the second Update waited for the first one's WAL sync")
	}
	select {
	case err := <-first:
		t.Fatalf("the first Update returned (%v) before its WAL sync", err)
	case err := <-second:
		t.Fatalf("the second Update returned (%v) before its WAL sync", err)
	case <-time.After(100 * time.Millisecond):
	}
	releaseSyncs()
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"first", "second"} {
		var v []byte
		err := db.View(ctx(t), func(tx storage.ReadTx) (err error) { v, err = tx.Get([]byte(k)); return err })
		if err != nil || string(v) != "v" {
			t.Fatalf("%s = %q, %v", k, v, err)
		}
	}
}
