package watch_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fdb-etcd/fdb-etcd/server"
)

// Once the hub has dispatched every revision the server has told a client
// of, a progress request on a synced stream is answered from memory, at
// once, with no read of the store — on either backend — and the answer is
// at least the revision of the write the client saw acknowledged.
func TestProgressAnsweredFromMemory(t *testing.T) {
	s := start(t, server.Config{})
	c := s.Client
	ctx := testCtx(t)
	R := put(t, c, "busy", "1")
	awaitReady(t, s)
	wch := c.Watch(ctx, "quiet", clientv3.WithCreatedNotify())
	if wr := <-wch; !wr.Created {
		t.Fatalf("watch not created: %+v", wr)
	}
	for i := range 3 {
		if err := c.RequestProgress(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case wr := <-wch:
			if !wr.IsProgressNotify() || wr.Header.Revision < R {
				t.Fatalf("request %d: got %+v, want a progress notification at %d or above", i, wr, R)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d not answered", i)
		}
	}
	memory := metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "memory")
	read := metric(t, s, "fdb_etcd_watch_progress_answers_total", "how", "read")
	if memory != 3 || read != 0 {
		t.Fatalf("progress answers: %v from memory, %v after a read; want 3 and 0", memory, read)
	}
}
