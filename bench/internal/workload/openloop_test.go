package workload

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestOpenLoopTimesTheWritesThatSucceeded checks what a watch row reports
// as its writes' own latency: every write that succeeded, timed from its
// issue to its return, and none that failed.
func TestOpenLoopTimesTheWritesThatSucceeded(t *testing.T) {
	const took = 5 * time.Millisecond
	r := OpenLoop{Rate: 200, Duration: 100 * time.Millisecond, OpTimeout: time.Second}.Run(context.Background(), func(ctx context.Context, i int64) error {
		time.Sleep(took)
		if i%4 == 0 {
			return errors.New("refused")
		}
		return nil
	})
	if r.Written == 0 || r.Errors == 0 {
		t.Fatalf("written %d, errors %d: want both", r.Written, r.Errors)
	}
	if n := r.Took.Count(); n != uint64(r.Written) {
		t.Fatalf("%d writes timed, %d written", n, r.Written)
	}
	if p50 := r.Took.Quantile(0.5); p50 < took || p50 > 10*took {
		t.Fatalf("p50 %v for writes that take %v", p50, took)
	}
}
