package server

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.uber.org/zap"

	"github.com/fdb-etcd/fdb-etcd/server/alarm"
	"github.com/fdb-etcd/fdb-etcd/server/cluster"
	"github.com/fdb-etcd/fdb-etcd/server/header"
	"github.com/fdb-etcd/fdb-etcd/server/kv"
	"github.com/fdb-etcd/fdb-etcd/server/leasesvc"
	"github.com/fdb-etcd/fdb-etcd/server/maintenance"
	"github.com/fdb-etcd/fdb-etcd/server/quota"
	"github.com/fdb-etcd/fdb-etcd/snapshot"
	"github.com/fdb-etcd/fdb-etcd/storage"
)

// errCorruptAlarm is why /readyz fails under a CORRUPT alarm, as etcd's
// data_corruption check does.
var errCorruptAlarm = errors.New("alarm CORRUPT raised")

// registerAPI registers the KV, Lease, Maintenance and Cluster services:
// writes (through kvStore and lessor, see writeRoutes) pass the backend
// quota and the stored alarms as in etcd, and the member list comes from
// the registry every replica keeps in the store.
func (s *Server) registerAPI(ctx context.Context, kvStore kv.Evaluator, lessor leasesvc.Lessor) error {
	alarms, err := s.openAlarms(ctx)
	if err != nil {
		return err
	}
	var sizer quota.Sizer
	if sz, ok := s.db.(storage.Sizer); ok {
		sizer = sz
	}
	q := quota.New(s.cfg.Quota, sizer)
	s.OnShutdown(q.Close)
	s.logQuota(q)
	if err := s.Metrics().Registry().Register(newAPICollector(q, alarms)); err != nil {
		return err
	}
	gate := quota.NewGate(q, alarms, s.hdr.MemberID, s.lg)
	kvs := kv.New(gate.CappedStore(kvStore), s.hdr, kv.Config{MaxTxnOps: s.cfg.MaxTxnOps, MaxRequestBytes: s.cfg.MaxRequestBytes})
	s.kvAPI = gate.KV(kvs)
	s.leaseAPI = gate.Lease(leasesvc.New(gate.CappedLessor(lessor), s.hdr))
	pb.RegisterKVServer(s.grpc, s.kvAPI)
	pb.RegisterLeaseServer(s.grpc, s.leaseAPI)

	mc := maintenance.Config{
		Store:  s.store,
		Header: s.hdr,
		Alarms: alarms,
		Quota:  q,
		Sizer:  sizer,
		Snapshotter: snapshot.New(s.store, snapshot.Config{MemberID: s.hdr.MemberID, MemberName: s.cfg.Name,
			ClientURLs: urlStrings(s.cfg.AdvertiseClientURLs), Term: header.RaftTerm, LeaseTTL: s.lessor.SnapshotTTL}),
	}
	if d, ok := s.db.(maintenance.Defragmenter); ok {
		mc.Defragmenter = d
	}
	pb.RegisterMaintenanceServer(s.grpc, maintenance.New(mc))
	return s.registerCluster(ctx)
}

// KVLease returns the KV and Lease services as this server registers them,
// for a process that serves them on a port of its own: package tenant takes
// the writes peers forward for many tenants on one connection.
func (s *Server) KVLease() (pb.KVServer, pb.LeaseServer) { return s.kvAPI, s.leaseAPI }

// openAlarms opens the stored alarms; /health reports them, and /readyz
// fails under CORRUPT.
func (s *Server) openAlarms(ctx context.Context) (*alarm.Store, error) {
	alarms, err := alarm.Open(ctx, s.db, s.lg)
	if err != nil {
		return nil, err
	}
	s.OnShutdown(alarms.Stop)
	s.ops.alarms = alarms
	s.AddReadyCheck("data_corruption", func(context.Context) error {
		if alarms.Active(pb.AlarmType_CORRUPT) {
			return errCorruptAlarm
		}
		return nil
	})
	return alarms, nil
}

// registerCluster registers this replica in the member registry and the
// Cluster service that lists it.
func (s *Server) registerCluster(ctx context.Context) error {
	if s.cfg.SharedMembers != nil {
		s.members = s.sharedMembers
		pb.RegisterClusterServer(s.grpc, cluster.New(s.hdr, s.members))
		return nil
	}
	rc := s.cfg.Members
	rc.ID, rc.Name, rc.ClientURLs = s.hdr.MemberID, s.cfg.Name, urlStrings(s.cfg.AdvertiseClientURLs)
	if rc.Logger == nil {
		rc.Logger = s.lg
	}
	reg, err := cluster.NewRegistry(ctx, s.db, rc)
	if err != nil {
		return err
	}
	s.OnShutdown(reg.Stop)
	s.members = reg.Members
	pb.RegisterClusterServer(s.grpc, cluster.New(s.hdr, s.members))
	return nil
}

// Members lists the live replicas as MemberList does.
func (s *Server) Members(ctx context.Context) ([]*pb.Member, error) { return s.members(ctx) }

// sharedMembers is SharedMembers under this keyspace's member ids, ordered
// by id as etcd orders them.
func (s *Server) sharedMembers(ctx context.Context) ([]*pb.Member, error) {
	ms, err := s.cfg.SharedMembers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*pb.Member, len(ms))
	for i, m := range ms {
		out[i] = &pb.Member{ID: memberID(s.hdr.ClusterID, m.Name), Name: m.Name, ClientURLs: m.ClientURLs}
	}
	slices.SortFunc(out, func(a, b *pb.Member) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// logQuota says which quota applies, as etcd does at start.
func (s *Server) logQuota(q *quota.Quota) {
	if !q.Enabled() {
		s.lg.Info("backend quota disabled", zap.Int64("quota-size-bytes", q.Bytes()))
		return
	}
	s.lg.Info("backend quota enabled", zap.Int64("quota-size-bytes", q.Bytes()))
}

// apiCollector exports etcd's quota and alarm metrics:
// etcd_server_quota_backend_bytes and etcd_debugging_server_alarms (1 per
// raised alarm, by member and type), read at scrape time.
type apiCollector struct {
	quota  *quota.Quota
	alarms *alarm.Store
	qd, ad *prometheus.Desc
}

func newAPICollector(q *quota.Quota, a *alarm.Store) *apiCollector {
	return &apiCollector{quota: q, alarms: a,
		qd: prometheus.NewDesc("etcd_server_quota_backend_bytes", "Current backend storage quota size in bytes.", nil, nil),
		ad: prometheus.NewDesc("etcd_debugging_server_alarms", "Alarms for every member in cluster. 1 for 'server_id' label with current ID. 2 for 'alarm_type' label with type of this alarm",
			[]string{"server_id", "alarm_type"}, nil),
	}
}

func (c *apiCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.qd; ch <- c.ad }

func (c *apiCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.qd, prometheus.GaugeValue, float64(c.quota.Bytes()))
	for _, a := range c.alarms.Cached(pb.AlarmType_NONE) {
		ch <- prometheus.MustNewConstMetric(c.ad, prometheus.GaugeValue, 1, types.ID(a.MemberID).String(), a.Alarm.String())
	}
}
