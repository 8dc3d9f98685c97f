package fakeclock_test

import (
	"testing"
	"time"

	"github.com/fdb-etcd/fdb-etcd/internal/clock/fakeclock"
)

func TestTicker(t *testing.T) {
	c := fakeclock.New(time.Unix(1_700_000_000, 0))
	tk := c.NewTicker(time.Second)
	defer tk.Stop()
	c.AwaitTickers(t, 1)
	c.Advance(999 * time.Millisecond)
	select {
	case <-tk.C():
		t.Fatal("fired early")
	default:
	}
	c.Advance(time.Millisecond)
	select {
	case <-tk.C():
	default:
		t.Fatal("did not fire")
	}
	c.Advance(5 * time.Second) // missed ticks collapse into one
	<-tk.C()
	select {
	case <-tk.C():
		t.Fatal("fired twice")
	default:
	}
}
