package tenant

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// inflight bounds how many unary requests one tenant runs at once in this
// replica, its own clients' and those peers forward for it together: the
// rest wait their turn, in order, before they cost anything (Config.
// MaxInflight). A nil inflight bounds nothing.
type inflight chan struct{}

func newInflight(n int) inflight {
	if n <= 0 {
		return nil
	}
	return make(inflight, n)
}

// acquire waits for a turn, or until ctx ends (then it fails with ctx's
// gRPC status, as the request would have).
func (l inflight) acquire(ctx context.Context) error {
	if l == nil {
		return nil
	}
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (l inflight) release() {
	if l != nil {
		<-l
	}
}

// unary is the interceptor that takes turns on l.
func (l inflight) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := l.acquire(ctx); err != nil {
			return nil, err
		}
		defer l.release()
		return handler(ctx, req)
	}
}
