// Package clock is the one source of time for the loops that keep ownership
// and expire leases. It is injected so that tests drive those loops without
// sleeping (package fakeclock).
//
// A process measures its own intervals (how long a record has gone
// unchanged, when to renew) with the monotonic reading time.Now carries:
// subtracting two Now values never goes backwards or jumps with a wall-clock
// step. Absolute times that other processes compare (lease deadlines) are
// wall-clock instants and are exposed to skew between machines.
package clock

import "time"

// Clock tells the time and sleeps.
type Clock interface {
	Now() time.Time
	// Sleep returns once d has elapsed or as soon as stop or wake is
	// closed (a nil channel never is). d <= 0 returns at once.
	Sleep(d time.Duration, stop, wake <-chan struct{})
}

// Real is the system clock.
type Real struct{}

// Now returns time.Now(), with its monotonic reading.
func (Real) Now() time.Time { return time.Now() }

// Sleep waits on a timer it stops on return.
func (Real) Sleep(d time.Duration, stop, wake <-chan struct{}) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	case <-wake:
	}
}
