package lease

import "time"

// Clock is the lessor's only source of time, injected so that tests drive
// expiry without sleeping (lease/leasetest has a fake). Lease deadlines are
// stored as the wall time of the Clock of the process that wrote them, so the
// clocks of processes sharing a store must agree to well within Extend.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has elapsed; d <= 0
	// fires at once.
	After(d time.Duration) <-chan time.Time
}

// RealClock is the system clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// After is time.After.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
