package tenant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Admin is the administration of tenants: `fdb-etcd tenant` runs its verbs
// against the store (Registry.Admin) or against a running fdb-etcd's admin
// service (AdminClient), which runs them with Registry.Admin in turn.
type Admin interface {
	CreateTenant(ctx context.Context, name string, q Quotas) (Record, error)
	DescribeTenant(ctx context.Context, name string) (Record, error)
	ListTenants(ctx context.Context) ([]Record, error)
	DeleteTenant(ctx context.Context, name string) error
	SetTenantQuotas(ctx context.Context, name string, c QuotaChange) (Record, error)
}

// Admin returns the registry's administration.
func (g *Registry) Admin() Admin { return registryAdmin{g} }

type registryAdmin struct{ g *Registry }

func (a registryAdmin) CreateTenant(ctx context.Context, name string, q Quotas) (Record, error) {
	return a.g.CreateWithQuotas(ctx, name, q)
}

func (a registryAdmin) DescribeTenant(ctx context.Context, name string) (Record, error) {
	return a.g.Get(ctx, name)
}

func (a registryAdmin) ListTenants(ctx context.Context) ([]Record, error) { return a.g.List(ctx) }

func (a registryAdmin) DeleteTenant(ctx context.Context, name string) error {
	return a.g.Delete(ctx, name)
}

func (a registryAdmin) SetTenantQuotas(ctx context.Context, name string, c QuotaChange) (Record, error) {
	return a.g.ChangeQuotas(ctx, name, c)
}

// The admin service is gRPC without protobuf: a service described by hand
// whose messages are JSON (jsonCodec), so that it needs no generated code.
// Its server is separate from the tenants' servers and reached only by
// the connections of Config.AdminCNs; a tenant's server answers its
// methods with permission denied (refuseAdmin).

// adminRequest is every method's request; a method reads what it needs.
type adminRequest struct {
	Name   string      `json:"name,omitempty"`
	Quotas Quotas      `json:"quotas"`
	Change QuotaChange `json:"change"`
}

// adminResponse is every method's response.
type adminResponse struct {
	Tenants []wireTenant `json:"tenants"`
}

// wireTenant is a Record on the wire, with its name.
type wireTenant struct {
	Name string `json:"name"`
	ID   uint64 `json:"id"`
	Quotas
}

// The methods of the admin service.
const (
	adminCreate   = "Create"
	adminDescribe = "Describe"
	adminList     = "List"
	adminDelete   = "Delete"
	adminSetQuota = "SetQuota"
)

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return "json" }

// serveAdmin runs one method of the admin service on a.
func serveAdmin(ctx context.Context, a Admin, method string, req adminRequest) (adminResponse, error) {
	var recs []Record
	var err error
	one := func(r Record, e error) { recs, err = []Record{r}, e }
	switch method {
	case adminCreate:
		one(a.CreateTenant(ctx, req.Name, req.Quotas))
	case adminDescribe:
		one(a.DescribeTenant(ctx, req.Name))
	case adminSetQuota:
		one(a.SetTenantQuotas(ctx, req.Name, req.Change))
	case adminList:
		recs, err = a.ListTenants(ctx)
	case adminDelete:
		err = a.DeleteTenant(ctx, req.Name)
	default:
		return adminResponse{}, status.Errorf(codes.Unimplemented, "unknown method %v for service %v", method, adminService)
	}
	if err != nil {
		return adminResponse{}, toStatus(err)
	}
	resp := adminResponse{Tenants: make([]wireTenant, 0, len(recs))}
	for _, r := range recs {
		resp.Tenants = append(resp.Tenants, wireTenant{Name: r.Name, ID: r.ID, Quotas: r.Quotas})
	}
	return resp, nil
}

// The registry's errors on the wire, both ways.
var adminErrors = []struct {
	err  error
	code codes.Code
}{
	{ErrNotFound, codes.NotFound},
	{ErrExists, codes.AlreadyExists},
	{ErrInvalidName, codes.InvalidArgument},
	{ErrInvalidQuota, codes.InvalidArgument},
}

func toStatus(err error) error {
	for _, e := range adminErrors {
		if errors.Is(err, e.err) {
			return status.Error(e.code, err.Error())
		}
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.FromContextError(err).Err()
}

// fromStatus gives the registry's errors back their identity (errors.Is);
// the message is the server's, which names the error already.
func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	for _, e := range adminErrors {
		if st.Code() == e.code && (e.code != codes.InvalidArgument || strings.HasPrefix(st.Message(), e.err.Error())) {
			return fmt.Errorf("%w%s", e.err, strings.TrimPrefix(st.Message(), e.err.Error()))
		}
	}
	return err
}

func adminMethod(method string) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: method,
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req adminRequest
			if err := dec(&req); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			resp, err := serveAdmin(ctx, srv.(Admin), method, req)
			if err != nil {
				return nil, err
			}
			return &resp, nil
		}}
}

// adminServer is the admin service's gRPC server, serving the connections
// the router hands it.
type adminServer struct {
	grpc *grpc.Server
	l    *connListener
	done chan struct{}
}

func startAdminServer(a Admin) *adminServer {
	s := &adminServer{grpc: grpc.NewServer(grpc.ForceServerCodec(jsonCodec{})), l: newConnListener(&net.TCPAddr{}), done: make(chan struct{})}
	s.grpc.RegisterService(&grpc.ServiceDesc{
		ServiceName: adminService,
		HandlerType: (*Admin)(nil),
		Methods: []grpc.MethodDesc{adminMethod(adminCreate), adminMethod(adminDescribe),
			adminMethod(adminList), adminMethod(adminDelete), adminMethod(adminSetQuota)},
	}, a)
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(s.l)
	}()
	return s
}

func (s *adminServer) stop() {
	s.grpc.Stop()
	_ = s.l.Close()
	<-s.done
}

// AdminClient runs the verbs on a running fdb-etcd's admin service, over
// a connection whose client certificate names an administrator.
type AdminClient struct{ conn grpc.ClientConnInterface }

// NewAdminClient returns the admin service's client over conn.
func NewAdminClient(conn grpc.ClientConnInterface) *AdminClient { return &AdminClient{conn: conn} }

func (c *AdminClient) call(ctx context.Context, method string, req adminRequest) ([]Record, error) {
	var resp adminResponse
	err := c.conn.Invoke(ctx, "/"+adminService+"/"+method, &req, &resp, grpc.ForceCodec(jsonCodec{}))
	if err != nil {
		return nil, fromStatus(err)
	}
	recs := make([]Record, 0, len(resp.Tenants))
	for _, t := range resp.Tenants {
		recs = append(recs, Record{Name: t.Name, ID: t.ID, Quotas: t.Quotas})
	}
	return recs, nil
}

func (c *AdminClient) one(ctx context.Context, method string, req adminRequest) (Record, error) {
	recs, err := c.call(ctx, method, req)
	if err != nil {
		return Record{}, err
	}
	if len(recs) != 1 {
		return Record{}, fmt.Errorf("tenant admin %s: %d tenants in the answer, want 1", method, len(recs))
	}
	return recs[0], nil
}

func (c *AdminClient) CreateTenant(ctx context.Context, name string, q Quotas) (Record, error) {
	return c.one(ctx, adminCreate, adminRequest{Name: name, Quotas: q})
}

func (c *AdminClient) DescribeTenant(ctx context.Context, name string) (Record, error) {
	return c.one(ctx, adminDescribe, adminRequest{Name: name})
}

func (c *AdminClient) ListTenants(ctx context.Context) ([]Record, error) {
	return c.call(ctx, adminList, adminRequest{})
}

func (c *AdminClient) DeleteTenant(ctx context.Context, name string) error {
	_, err := c.call(ctx, adminDelete, adminRequest{Name: name})
	return err
}

func (c *AdminClient) SetTenantQuotas(ctx context.Context, name string, c2 QuotaChange) (Record, error) {
	return c.one(ctx, adminSetQuota, adminRequest{Name: name, Change: c2})
}
