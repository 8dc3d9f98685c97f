package tenant

import (
	"context"

	"google.golang.org/grpc"

	"github.com/fdb-etcd/fdb-etcd/internal/fairsched"
)

// turns are one tenant's turns on the process's scheduler (Config.Fair):
// its unary requests, its own clients' and those peers forward for it
// together, take a slot before they cost anything, so that once the
// process runs as many requests as it has slots, a tenant with one waiting
// is served before another tenant's second. Zero turns (no scheduler)
// admit everything at once.
type turns struct {
	s      *fairsched.Scheduler
	tenant string
}

// acquire waits for a slot; the release it returns gives it back.
func (t turns) acquire(ctx context.Context) (release func(), err error) {
	if t.s == nil {
		return func() {}, nil
	}
	return t.s.Acquire(ctx, t.tenant, 1)
}

// unary is the interceptor that takes turns.
func (t turns) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, err := t.acquire(ctx)
		if err != nil {
			return nil, err
		}
		// A write hands its slot back once it waits for its commit
		// (groupcommit.Queue.Do), so the slot bounds evaluation only.
		ctx, release = fairsched.Hold(ctx, release)
		defer release()
		return handler(ctx, req)
	}
}
