package mvcc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fdb-etcd/fdb-etcd/mvcc"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// slowView is a viewHook whose hooked Views take a while to read, and are
// abandoned, as FoundationDB's are, when their context ends meanwhile.
type slowView struct{ viewHook }

func (v *slowView) View(ctx context.Context, fn func(storage.ReadTx) error) error {
	if ctx.Value(hookedKey{}) != nil {
		v.hook()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return v.DB.View(ctx, fn)
}

// TestWaitRevWakeEndsOnlyTheWait: closing wake ends WaitRev's wait for
// the head to change, with the head it read and no error, but never the
// read itself: a replica's watch hub is woken at nearly every commit, and
// a wake that cancelled the read in flight threw that read away.
func TestWaitRevWakeEndsOnlyTheWait(t *testing.T) {
	shared := openPebble(t)
	db := &slowView{viewHook: viewHook{DB: shared, hook: func() {}}}
	s := openStore(t, db, mvcc.Config{})
	// Another store writes: s knows the head only by reading it (its own
	// last commit it would know from its log's tail).
	writer := openStore(t, shared, mvcc.Config{})
	put, err := writer.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	head := put.Header.Revision
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), hookedKey{}, true), 10*time.Second)
	defer cancel()
	for _, when := range []string{"during the read of the head", "while it waits"} {
		wake := make(chan struct{})
		var once sync.Once
		db.hook = func() {
			once.Do(func() {
				if when == "during the read of the head" {
					close(wake)
					return
				}
				go func() {
					time.Sleep(40 * time.Millisecond)
					close(wake)
				}()
			})
		}
		rev, err := s.WaitRev(ctx, head, wake)
		if err != nil || rev != head {
			t.Fatalf("wake %s: WaitRev = %d, %v; want the head %d and no error", when, rev, err, head)
		}
	}
}
