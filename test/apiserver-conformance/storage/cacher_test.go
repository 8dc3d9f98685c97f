package storage

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/cacher/consistency"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcd3testing "k8s.io/apiserver/pkg/storage/etcd3/testing"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// getPodAttrs is cacher_test.go's GetPodAttrs.
func getPodAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("not a pod")
	}
	return labels.Set(pod.ObjectMeta.Labels), fields.Set{
		"spec.nodeName":      pod.Spec.NodeName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy),
		"status.phase":       string(pod.Status.Phase),
		"metadata.name":      pod.Name,
		"metadata.namespace": pod.Namespace,
	}, nil
}

type cacherSetup struct {
	clusterScoped bool
	indexes       bool
	noDigest      bool
}

type cacherOpt func(*cacherSetup)

func withClusterScopedKeyFunc(o *cacherSetup)      { o.clusterScoped = true }
func withNodeNameAndNamespaceIndex(o *cacherSetup) { o.indexes = true }

// withoutDigestCheck skips the closing consistency digest for tests whose
// objects the cache and storage list differently by design (the digest
// differs on etcd too).
func withoutDigestCheck(o *cacherSetup) { o.noDigest = true }

// cacherEnv is what one cacher-level test gets.
type cacherEnv struct {
	*storeEnv
	cacher    *cacher.Cacher
	delegator *cacher.CacheDelegator
}

// setupCacher mirrors cacher_test.go's testSetupWithEtcdServer: an etcd3 store
// (protobuf codec, identity transformer) wrapped in one injected LIST error,
// a Cacher from NewCacherFromConfig, waited for, and a CacheDelegator.
func setupCacher(t *testing.T, be backend, opts ...cacherOpt) *cacherEnv {
	t.Helper()
	var o cacherSetup
	for _, f := range opts {
		f(&o)
	}
	e := setupStore(t, be, withCodec(examplev1ProtoCodec), withTransformer(identity.NewEncryptCheckTransformer()),
		withLeaseConfig(etcd3.NewDefaultLeaseManagerConfig()), withFixedPrefix(etcd3testing.PathPrefix()))
	listErrors := 1
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		listErrors = 0
	}
	wrapped := &storagetesting.StorageInjectingListErrors{Interface: e.store, Errors: listErrors}
	prefix := "/pods/"
	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) }
	if o.clusterScoped {
		keyFunc = func(obj runtime.Object) (string, error) { return storage.NoNamespaceKeyFunc(prefix, obj) }
	}
	var indexerFuncs map[string]storage.IndexerFunc
	var indexers cache.Indexers
	if o.indexes {
		indexerFuncs = map[string]storage.IndexerFunc{
			"spec.nodeName": func(obj runtime.Object) string {
				pod, ok := obj.(*example.Pod)
				if !ok {
					return ""
				}
				return pod.Spec.NodeName
			},
		}
		indexers = map[string]cache.IndexFunc{
			"f:spec.nodeName": func(obj interface{}) ([]string, error) {
				return []string{obj.(*example.Pod).Spec.NodeName}, nil
			},
			"f:metadata.namespace": func(obj interface{}) ([]string, error) {
				return []string{obj.(*example.Pod).ObjectMeta.Namespace}, nil
			},
		}
	}
	c, err := cacher.NewCacherFromConfig(cacher.Config{
		Storage:             wrapped,
		Versioner:           storage.APIObjectVersioner{},
		GroupResource:       schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      prefix,
		KeyFunc:             keyFunc,
		GetAttrsFunc:        getPodAttrs,
		NewFunc:             newPod,
		NewListFunc:         newPodList,
		IndexerFuncs:        indexerFuncs,
		Indexers:            &indexers,
		Codec:               examplev1ProtoCodec,
		Clock:               clock.RealClock{},
	})
	if err != nil {
		t.Fatalf("Failed to initialize cacher: %v", err)
	}
	ctx := context.Background()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return wrapped.ErrorsConsumed()
	}); err != nil {
		c.Stop()
		t.Fatalf("Failed to inject list errors: %v", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.Wait(waitCtx); err != nil {
		c.Stop()
		t.Fatal(err)
	}
	d := cacher.NewCacheDelegator(c, wrapped)
	ce := &cacherEnv{storeEnv: e, cacher: c, delegator: d}
	t.Cleanup(func() {
		if !t.Failed() && !o.noDigest {
			ce.checkConsistency(t)
		}
		d.Stop()
		c.Stop()
	})
	return ce
}

// compactCacher is cacher_test.go's compactStore: compact storage, wait until
// the store observes it, then (instead of calling the cacher compactor's
// unexported compactIfNeeded) wait out the compactor's 15 s poll period.
func (ce *cacherEnv) compactCacher(snapshots bool) storagetesting.Compaction {
	compact := ce.compactStorage(snapshots)
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		compact(ctx, t, resourceVersion)
		if snapshots {
			time.Sleep(cacherCompactorPollPeriod + time.Second)
		}
	}
}

// cacherCompactorPollPeriod is cacher/compactor.go's compactorPollPeriod.
const cacherCompactorPollPeriod = 15 * time.Second

// checkConsistency runs the watch-cache consistency checker's digest
// (what KUBE_WATCHCACHE_CONSISTENCY_CHECKER panics on) once at the end of
// every cacher test: cache at its resourceVersion versus storage at the same.
func (ce *cacherEnv) checkConsistency(t *testing.T) {
	checker := consistency.NewChecker("/pods/", schema.GroupResource{Resource: "pods"}, newPodList, ce.cacher, ce.store)
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		d, err := checker.CalculateDigests(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if d.CacheDigest != d.EtcdDigest {
			last = fmt.Sprintf("resourceVersion %s: cache digest %s, storage digest %s, diff %v", d.ResourceVersion, d.CacheDigest, d.EtcdDigest, d.DiffDetail)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("watch-cache consistency check failed: %s", last)
	}
}

func cacherSimple(name string, f func(ctx context.Context, t *testing.T, s storage.Interface), opts ...cacherOpt) testCase {
	return testCase{name: name, run: func(t *testing.T, be backend) {
		ce := setupCacher(t, be, opts...)
		f(ce.ctx, t, ce.delegator)
	}}
}

func noCalls(t *testing.T, pageSize, estimatedProcessedObjects uint64) {}

func noValidation(ctx context.Context, t *testing.T, key string) {}

// createWrapper is cacher_test.go's: Create, then wait until the cache serves it.
type createWrapper struct {
	*cacher.CacheDelegator
}

func (c *createWrapper) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.CacheDelegator.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		currentObj := newPod()
		err := c.CacheDelegator.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, currentObj)
		if err != nil {
			if storage.IsNotFound(err) {
				return false, nil
			}
			return false, err
		}
		return apiequality.Semantic.DeepEqual(currentObj, out), nil
	})
}

// cacherCases mirrors k8s.io/apiserver/pkg/storage/cacher/cacher_test.go.
// Left out, as there: ListInconsistentContinuation, ListResourceVersionMatch,
// GuaranteedUpdate, GuaranteedUpdateChecksStoredData, TransformationFailure,
// WatchError, WatchContextCancel (upstream TODO #109831). Also left out:
// WatchFromZero and CompactRevision, whose cacher-side compaction reaches
// into the cacher's unexported watch-cache history.
func cacherCases() []testCase {
	cs := []testCase{
		cacherSimple("Create", func(ctx context.Context, t *testing.T, s storage.Interface) {
			storagetesting.RunTestCreate(ctx, t, s, noValidation)
		}),
		cacherSimple("CreateWithTTL", storagetesting.RunTestCreateWithTTL),
		cacherSimple("CreateWithKeyExist", storagetesting.RunTestCreateWithKeyExist),
		cacherSimple("Get", storagetesting.RunTestGet),
		cacherSimple("UnconditionalDelete", storagetesting.RunTestUnconditionalDelete),
		cacherSimple("ConditionalDelete", storagetesting.RunTestConditionalDelete),
		cacherSimple("DeleteWithSuggestion", storagetesting.RunTestDeleteWithSuggestion),
		cacherSimple("DeleteWithSuggestionAndConflict", storagetesting.RunTestDeleteWithSuggestionAndConflict),
		cacherSimple("DeleteWithSuggestionOfDeletedObject", storagetesting.RunTestDeleteWithSuggestionOfDeletedObject),
		cacherSimple("ValidateDeletionWithSuggestion", storagetesting.RunTestValidateDeletionWithSuggestion),
		cacherSimple("ValidateDeletionWithOnlySuggestionValid", storagetesting.RunTestValidateDeletionWithOnlySuggestionValid),
		cacherSimple("DeleteWithConflict", storagetesting.RunTestDeleteWithConflict),
		cacherSimple("DeleteWithSuggestionAndMissingExpectedTransformOrDecodeError", func(ctx context.Context, t *testing.T, s storage.Interface) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, s)
		}),
		cacherSimple("PreconditionalDeleteWithSuggestion", storagetesting.RunTestPreconditionalDeleteWithSuggestion),
		cacherSimple("PreconditionalDeleteWithSuggestionPass", storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass),
		cacherSimple("ListPaging", storagetesting.RunTestListPaging),
	}
	for _, snap := range []bool{true, false} {
		snap := snap
		p := fmt.Sprintf("Lists/ListFromCacheSnapshot=%v/", snap)
		cs = append(cs,
			testCase{name: p + "List", run: func(t *testing.T, be backend) {
				gate(t, features.ListFromCacheSnapshot, snap)
				ce := setupCacher(t, be)
				storagetesting.RunTestList(ce.ctx, t, ce.delegator, ce.compactCacher(snap), true, ce.kubeRecorder())
			}},
			testCase{name: p + "ConsistentList", run: func(t *testing.T, be backend) {
				gate(t, features.ListFromCacheSnapshot, snap)
				ce := setupCacher(t, be)
				storagetesting.RunTestConsistentList(ce.ctx, t, ce.delegator, increaseRVFunc(ce.client.Client), true, true, snap)
			}},
			testCase{name: p + "GetListNonRecursive", run: func(t *testing.T, be backend) {
				gate(t, features.ListFromCacheSnapshot, snap)
				ce := setupCacher(t, be)
				storagetesting.RunTestGetListNonRecursive(ce.ctx, t, increaseRVFunc(ce.client.Client), ce.delegator)
			}},
		)
	}
	cs = append(cs,
		cacherSimple("GetListRecursivePrefix", storagetesting.RunTestGetListRecursivePrefix),
		cacherSimple("ListContinuation", func(ctx context.Context, t *testing.T, s storage.Interface) {
			storagetesting.RunTestListContinuation(ctx, t, s, noCalls)
		}),
		cacherSimple("ListPaginationRareObject", func(ctx context.Context, t *testing.T, s storage.Interface) {
			storagetesting.RunTestListPaginationRareObject(ctx, t, s, noCalls)
		}),
		cacherSimple("ListContinuationWithFilter", func(ctx context.Context, t *testing.T, s storage.Interface) {
			storagetesting.RunTestListContinuationWithFilter(ctx, t, s, noCalls)
		}),
		cacherSimple("NamespaceScopedList", storagetesting.RunTestNamespaceScopedList, withNodeNameAndNamespaceIndex),
		cacherSimple("GuaranteedUpdateWithTTL", storagetesting.RunTestGuaranteedUpdateWithTTL),
		cacherSimple("GuaranteedUpdateWithConflict", storagetesting.RunTestGuaranteedUpdateWithConflict, withoutDigestCheck),
		cacherSimple("GuaranteedUpdateWithSuggestionAndConflict", storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict),
	)
	for _, sized := range []bool{true, false} {
		sized := sized
		cs = append(cs, testCase{name: fmt.Sprintf("Stats/SizeBasedListCostEstimate=%v", sized), run: func(t *testing.T, be backend) {
			gate(t, features.SizeBasedListCostEstimate, sized)
			ce := setupCacher(t, be)
			storagetesting.RunTestStats(ce.ctx, t, ce.delegator, examplev1ProtoCodec, identity.NewEncryptCheckTransformer(), sized)
		}})
	}
	cs = append(cs,
		cacherSimple("KeySchema", storagetesting.RunTestKeySchema, withoutDigestCheck),
		cacherSimple("Watch/Watch", storagetesting.RunTestWatch),
		cacherSimple("Watch/DeleteTriggerWatch", storagetesting.RunTestDeleteTriggerWatch),
		cacherSimple("Watch/WatchFromNonZero", storagetesting.RunTestWatchFromNonZero),
		cacherSimple("Watch/DelayedWatchDelivery", storagetesting.RunTestDelayedWatchDelivery),
		cacherSimple("Watch/WatcherTimeout", storagetesting.RunTestWatcherTimeout),
		cacherSimple("Watch/WatchDeleteEventObjectHaveLatestRV", storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV),
		cacherSimple("Watch/WatchInitializationSignal", storagetesting.RunTestWatchInitializationSignal),
		cacherSimple("Watch/ClusterScopedWatch", storagetesting.RunTestClusterScopedWatch, withClusterScopedKeyFunc, withNodeNameAndNamespaceIndex),
		cacherSimple("Watch/NamespaceScopedWatch", storagetesting.RunTestNamespaceScopedWatch, withNodeNameAndNamespaceIndex),
		cacherSimple("Watch/WatchDispatchBookmarkEvents", func(ctx context.Context, t *testing.T, s storage.Interface) {
			storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, s, true)
		}),
		cacherSimple("Watch/WatchBookmarksWithCorrectResourceVersion", storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion),
		cacherSimple("Watch/SendInitialEventsBackwardCompatibility", storagetesting.RunSendInitialEventsBackwardCompatibility),
		testCase{name: "Watch/WatchSemantics", run: func(t *testing.T, be backend) {
			ce := setupCacher(t, be)
			storagetesting.RunWatchSemantics(context.TODO(), t, &createWrapper{ce.delegator})
		}},
		testCase{name: "Watch/WatchSemanticInitialEventsExtended", run: func(t *testing.T, be backend) {
			ce := setupCacher(t, be)
			storagetesting.RunWatchSemanticInitialEventsExtended(context.TODO(), t, &createWrapper{ce.delegator})
		}},
		testCase{name: "Watch/WatchListMatchSingle", run: func(t *testing.T, be backend) {
			ce := setupCacher(t, be)
			storagetesting.RunWatchListMatchSingle(context.TODO(), t, &createWrapper{ce.delegator})
		}},
	)
	return cs
}
