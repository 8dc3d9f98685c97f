package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	"google.golang.org/grpc/grpclog"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/utils/clock"

	"github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance/internal/fdbetcd"
)

var (
	scheme              = runtime.NewScheme()
	codecs              = serializer.NewCodecFactory(scheme)
	examplev1ProtoCodec runtime.Codec
)

// defaultTestPrefix is what storagetesting.PrefixTransformer prepends to values.
const defaultTestPrefix = "test!"

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	pb := protobuf.NewSerializer(scheme, scheme)
	examplev1ProtoCodec = codecs.CodecForVersions(pb, pb, schema.GroupVersions{examplev1.SchemeGroupVersion}, nil)
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

func newPod() runtime.Object     { return &example.Pod{} }
func newPodList() runtime.Object { return &example.PodList{} }

// serverOptions configure the fresh server one test gets.
type serverOptions struct {
	progressNotifyInterval time.Duration
}

// backend is the server under test: the reference (embedded etcd) or fdb-etcd.
type backend struct {
	name string
	// client starts a fresh server for t and returns a client like the one
	// k8s.io/apiserver's own tests use (KV and Kubernetes wrapped in recorders).
	client func(t testing.TB, o serverOptions) *kubernetes.Client
}

var (
	backendEtcd = backend{name: "etcd", client: func(t testing.TB, o serverOptions) *kubernetes.Client {
		cfg := testserver.NewTestConfig(t)
		if o.progressNotifyInterval > 0 {
			cfg.WatchProgressNotifyInterval = o.progressNotifyInterval
		}
		return testserver.RunEtcd(t, cfg)
	}}
	backendFDBEtcd = backend{name: "fdb-etcd", client: func(t testing.TB, o serverOptions) *kubernetes.Client {
		srv := fdbetcd.StartT(t, fdbetcd.Options{ProgressNotifyInterval: o.progressNotifyInterval})
		return newRecordedClient(t, srv.URL)
	}}
	// backendFDB is three fdb-etcd replicas in a fresh keyspace of the run's
	// FoundationDB cluster, the client balancing over all three.
	backendFDB = backend{name: "fdb-etcd-fdb", client: func(t testing.TB, o serverOptions) *kubernetes.Client {
		r := fdbetcd.StartReplicasT(t, fdbCluster, fdbReplicas, fdbetcd.Options{ProgressNotifyInterval: o.progressNotifyInterval})
		return newRecordedClient(t, r.URLs()...)
	}}
	backends = []backend{backendEtcd, backendFDBEtcd, backendFDB}
)

// fdbReplicas is how many fdb-etcd replicas share a keyspace on FoundationDB.
const fdbReplicas = 3

// fdbCluster is the FoundationDB cluster of the run (TestMain), nil when
// the FoundationDB half does not run.
var fdbCluster *fdbetcd.FDB

// newRecordedClient mirrors testserver.RunEtcd's client construction.
func newRecordedClient(t testing.TB, endpoints ...string) *kubernetes.Client {
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	rec := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, rec)
	client.Kubernetes = rec
	return client
}

// ownClient opens a second, plain client to the same server (the compactor's).
func ownClient(t testing.TB, c *kubernetes.Client) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var prefixSeq atomic.Int64

// uniquePrefix is the etcd key prefix one test's store lives under.
func uniquePrefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_", "=", "_").Replace(t.Name())
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return fmt.Sprintf("/conformance-%d-%s", prefixSeq.Add(1), name)
}

// swapTransformer lets tests replace the transformer of a store built with
// etcd3.New from outside the package (the apiserver's own tests mutate the
// unexported field; the store and its watcher share this one object).
type swapTransformer struct {
	mu   sync.RWMutex
	cur  value.Transformer
	orig value.Transformer
}

func newSwapTransformer(t value.Transformer) *swapTransformer {
	return &swapTransformer{cur: t, orig: t}
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	s.cur = t
	s.mu.Unlock()
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// storeWithPrefixTransformer implements storagetesting.InterfaceWithPrefixTransformer.
type storeWithPrefixTransformer struct {
	storage.Interface
	swap *swapTransformer
}

func (s *storeWithPrefixTransformer) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	orig := s.swap.get()
	pt, ok := orig.(*storagetesting.PrefixTransformer)
	if !ok {
		panic(fmt.Sprintf("store transformer is %T, not *storagetesting.PrefixTransformer", orig))
	}
	cp := *pt
	s.swap.set(modifier(&cp))
	return func() { s.swap.set(orig) }
}

// storeWithTransformerOverride implements storagetesting.InterfaceWithTransformerOverride.
type storeWithTransformerOverride struct {
	storage.Interface
	swap *swapTransformer
}

func (s *storeWithTransformerOverride) UpdateTransformer(modifier storagetesting.TransformerModifier) func() {
	orig := s.swap.get()
	s.swap.set(modifier(orig))
	return func() { s.swap.set(orig) }
}

// corruptObjectErr returns the etcd3 package's (unexported) corrupt-object
// error value, as the apiserver's own tests construct it.
func corruptObjectErr() error {
	_, _, err := etcd3.WithCorruptObjErrorHandlingTransformer(failingTransformer{}).TransformFromStorage(context.Background(), nil, nil)
	return err
}

type failingTransformer struct{}

func (failingTransformer) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, false, errors.New("bits flipped")
}
func (failingTransformer) TransformToStorage(context.Context, []byte, value.Context) ([]byte, error) {
	return nil, errors.New("bits flipped")
}

// failTransformer / failCodec fail reads on demand (store_test.go's testTransformer/testCodec).
type failTransformer struct {
	value.Transformer
	fail atomic.Bool
}

func (tt *failTransformer) setFailing(c bool) { tt.fail.Store(c) }
func (tt *failTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if tt.fail.Load() {
		return nil, false, errors.New("synthetic error")
	}
	return tt.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

type failCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (tc *failCodec) setFailing(c bool) { tc.fail.Store(c) }
func (tc *failCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if tc.fail.Load() {
		return nil, nil, errors.New("synthetic error")
	}
	return tc.Codec.Decode(data, defaults, into)
}

// storeSetup configures one etcd3 store (store_test.go's setupOptions).
type storeSetup struct {
	server      serverOptions
	codec       runtime.Codec
	transformer value.Transformer
	leaseConfig etcd3.LeaseManagerConfig
	// fixedPrefix replaces the unique per-test key prefix, for tests that
	// compare keys in error messages or recorded requests with fixed strings
	// (each test has its own server all the same).
	fixedPrefix string
}

type storeOpt func(*storeSetup)

func withCodec(c runtime.Codec) storeOpt           { return func(s *storeSetup) { s.codec = c } }
func withTransformer(t value.Transformer) storeOpt { return func(s *storeSetup) { s.transformer = t } }
func withProgressNotify(d time.Duration) storeOpt {
	return func(s *storeSetup) { s.server.progressNotifyInterval = d }
}
func withFixedPrefix(p string) storeOpt { return func(s *storeSetup) { s.fixedPrefix = p } }
func withLeaseConfig(c etcd3.LeaseManagerConfig) storeOpt {
	return func(s *storeSetup) { s.leaseConfig = c }
}

// storeEnv is what one etcd3-level test gets.
type storeEnv struct {
	ctx        context.Context
	store      storage.Interface
	swap       *swapTransformer
	client     *kubernetes.Client // recorded, used by the store
	compactCli *clientv3.Client   // the compactor's own client
	codec      runtime.Codec
	pathPrefix string // etcd key prefix of the store ("/conformance-N-.../")
}

func (e *storeEnv) withPrefixTransformer() storagetesting.InterfaceWithPrefixTransformer {
	return &storeWithPrefixTransformer{Interface: e.store, swap: e.swap}
}

func (e *storeEnv) withTransformerOverride(s storage.Interface) storagetesting.InterfaceWithTransformerOverride {
	if s == nil {
		s = e.store
	}
	return &storeWithTransformerOverride{Interface: s, swap: e.swap}
}

func (e *storeEnv) groupResource() schema.GroupResource {
	return schema.GroupResource{Resource: "pods"}
}

func (e *storeEnv) prefixTransformer() *storagetesting.PrefixTransformer {
	return e.swap.orig.(*storagetesting.PrefixTransformer)
}

func (e *storeEnv) kvRecorder() *storagetesting.KVRecorder {
	return e.client.KV.(*storagetesting.KVRecorder)
}

func (e *storeEnv) kubeRecorder() *storagetesting.KubernetesRecorder {
	return e.client.Kubernetes.(*storagetesting.KubernetesRecorder)
}

// setupStore mirrors k8s.io/apiserver/pkg/storage/etcd3/store_test.go testSetup
// over a fresh server of the given backend.
func setupStore(t *testing.T, be backend, opts ...storeOpt) *storeEnv {
	t.Helper()
	s := storeSetup{
		codec:       apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
		transformer: storagetesting.NewPrefixTransformer([]byte(defaultTestPrefix), false),
		leaseConfig: etcd3.LeaseManagerConfig{ReuseDurationSeconds: 1, MaxObjectCount: etcd3.NewDefaultLeaseManagerConfig().MaxObjectCount},
	}
	for _, o := range opts {
		o(&s)
	}
	prefix := uniquePrefix(t)
	if s.fixedPrefix != "" {
		prefix = s.fixedPrefix
	}
	resetFeatureSupportChecker(t)
	client := be.client(t, s.server)
	compactCli := ownClient(t, client)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(compactCli, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	swap := newSwapTransformer(s.transformer)
	st, err := etcd3.New(client, compactor, s.codec, newPod, newPodList, prefix, "/pods/",
		schema.GroupResource{Resource: "pods"}, swap, s.leaseConfig,
		etcd3.NewDefaultDecoder(s.codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	waitWatchProgressSupported(t)
	pp := prefix
	if !strings.HasSuffix(pp, "/") {
		pp += "/"
	}
	return &storeEnv{ctx: context.Background(), store: st, swap: swap, client: client, compactCli: compactCli, codec: s.codec, pathPrefix: pp}
}

// resetFeatureSupportChecker gives each test its own RequestWatchProgress
// support check, as every test has its own server.
func resetFeatureSupportChecker(t *testing.T) {
	orig := etcdfeature.DefaultFeatureSupportChecker
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()
	t.Cleanup(func() { etcdfeature.DefaultFeatureSupportChecker = orig })
}

// waitWatchProgressSupported waits for the asynchronous version check the
// store starts: the apiserver decides from Status().Version whether the
// server supports RequestWatchProgress.
func waitWatchProgressSupported(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress) {
		if time.Now().After(deadline) {
			t.Fatal("the apiserver's feature checker did not find RequestWatchProgress supported (Maintenance.Status version)")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkStorageInvariants is store_test.go's KeyValidation: the stored value
// decodes and carries no resourceVersion or selfLink.
func (e *storeEnv) checkStorageInvariants() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		full := e.pathPrefix + strings.TrimPrefix(key, "/")
		getResp, err := e.client.Client.KV.Get(ctx, full)
		if err != nil {
			t.Fatalf("etcdClient.KV.Get failed: %v", err)
		}
		if len(getResp.Kvs) == 0 {
			t.Fatalf("expecting non empty result on key: %s", full)
		}
		decoded, err := runtime.Decode(e.codec, getResp.Kvs[0].Value[len(defaultTestPrefix):])
		if err != nil {
			t.Fatalf("expecting successful decode of object from %v\n%v", err, string(getResp.Kvs[0].Value))
		}
		obj := decoded.(*example.Pod)
		if obj.ResourceVersion != "" {
			t.Errorf("stored object should have empty resource version")
		}
		if obj.SelfLink != "" {
			t.Errorf("stored output should have empty selfLink")
		}
	}
}

// compactStorage is store_test.go's Compaction: etcd3.Compact on the
// compactor's client, then wait until the store observes it (when it watches
// the compact key, i.e. ListFromCacheSnapshot is on).
func (e *storeEnv) compactStorage(waitObserved bool) storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		var currentVersion int64
		currentVersion, _, _, err = etcd3.Compact(ctx, e.compactCli, currentVersion, int64(rv))
		if err != nil {
			_, _, _, err = etcd3.Compact(ctx, e.compactCli, currentVersion, int64(rv))
		}
		if err != nil {
			t.Fatal(err)
		}
		if waitObserved {
			deadline := time.Now().Add(30 * time.Second)
			for e.store.CompactRevision() != int64(rv) {
				if time.Now().After(deadline) {
					t.Fatalf("store did not observe compaction to %d (sees %d)", rv, e.store.CompactRevision())
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

func increaseRVFunc(client *clientv3.Client) storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := client.KV.Put(ctx, "increaseRV", "ok")
		if err != nil {
			t.Fatalf("Could not update increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// getKeys is the store's (unexported) KeysFunc for size estimation.
func (e *storeEnv) getKeys(ctx context.Context) ([]string, error) {
	resp, err := e.client.Client.KV.Get(ctx, e.pathPrefix+"pods/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, nil
}

// maxLimit mirrors etcd3's maximum page size.
const maxLimit = 10000

// checkStorageCallsInvariants is store_test.go's CallsValidation.
func (e *storeEnv) checkStorageCallsInvariants() storagetesting.CallsValidation {
	transformer, recorder := e.prefixTransformer(), e.kvRecorder()
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if reads := transformer.GetReadsAndReset(); reads != estimatedProcessedObjects {
			t.Errorf("unexpected reads: %d, expected: %d", reads, estimatedProcessedObjects)
		}
		estimatedGetCalls := uint64(1)
		if pageSize != 0 {
			currLimit := pageSize
			for sum := uint64(1); sum < estimatedProcessedObjects; {
				currLimit *= 2
				if currLimit > maxLimit {
					currLimit = maxLimit
				}
				sum += currLimit
				estimatedGetCalls++
			}
		}
		if reads := recorder.GetReadsAndReset() + recorder.GetStreamReadsAndReset(); reads != estimatedGetCalls {
			t.Fatalf("unexpected reads: %d, want: %d", reads, estimatedGetCalls)
		}
	}
}
