package storage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// testCase is one entry of the selection: run gets a fresh server of the
// backend under test.
type testCase struct {
	name string
	run  func(t *testing.T, be backend)
	// skip, when set, is why the case is not run (on either backend).
	skip string
}

func gate(t *testing.T, f featuregate.Feature, on bool) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, f, on)
}

// simple wraps a RunTest* that needs only the store.
func simple(name string, f func(ctx context.Context, t *testing.T, s storage.Interface)) testCase {
	return testCase{name: name, run: func(t *testing.T, be backend) {
		e := setupStore(t, be)
		f(e.ctx, t, e.store)
	}}
}

// etcd3Cases mirrors k8s.io/apiserver/pkg/storage/etcd3/store_test.go and
// watcher_test.go: every storagetesting.RunTest* they call, with the same
// arguments and feature gates.
func etcd3Cases() []testCase {
	cs := []testCase{
		{name: "Create", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestCreate(e.ctx, t, e.store, e.checkStorageInvariants())
		}},
		simple("CreateWithTTL", storagetesting.RunTestCreateWithTTL),
		simple("CreateWithKeyExist", storagetesting.RunTestCreateWithKeyExist),
		simple("Get", storagetesting.RunTestGet),
		simple("UnconditionalDelete", storagetesting.RunTestUnconditionalDelete),
		simple("ConditionalDelete", storagetesting.RunTestConditionalDelete),
		simple("DeleteWithSuggestion", storagetesting.RunTestDeleteWithSuggestion),
		simple("DeleteWithSuggestionAndConflict", storagetesting.RunTestDeleteWithSuggestionAndConflict),
		simple("DeleteWithSuggestionOfDeletedObject", storagetesting.RunTestDeleteWithSuggestionOfDeletedObject),
		simple("ValidateDeletionWithSuggestion", storagetesting.RunTestValidateDeletionWithSuggestion),
		simple("ValidateDeletionWithOnlySuggestionValid", storagetesting.RunTestValidateDeletionWithOnlySuggestionValid),
		simple("DeleteWithConflict", storagetesting.RunTestDeleteWithConflict),
		{name: "DeleteWithConflictAndMissingExpectedTransformOrDecodeError", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			codec := &failCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
			e := setupStore(t, be, withCodec(codec))
			storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store, codec.setFailing)
		}},
		{name: "DeleteWithConflictAndExpectedTransformError", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			tr := &failTransformer{Transformer: storagetesting.NewPrefixTransformer([]byte(defaultTestPrefix), false)}
			e := setupStore(t, be, withTransformer(tr))
			storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, tr.setFailing)
		}},
		{name: "DeleteWithConflictAndExpectedDecodeError", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			codec := &failCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
			e := setupStore(t, be, withCodec(codec))
			storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, codec.setFailing)
		}},
		{name: "DeleteWithSuggestionAndMissingExpectedTransformOrDecodeFailure", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			e := setupStore(t, be)
			storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store)
		}},
		simple("PreconditionalDeleteWithSuggestion", storagetesting.RunTestPreconditionalDeleteWithSuggestion),
		simple("PreconditionalDeleteWithSuggestionPass", storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass),
		simple("ListPaging", storagetesting.RunTestListPaging),
		{name: "GetListNonRecursive", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestGetListNonRecursive(e.ctx, t, increaseRVFunc(e.client.Client), e.store)
		}},
		simple("GetListRecursivePrefix", storagetesting.RunTestGetListRecursivePrefix),
		simple("KeySchema", storagetesting.RunTestKeySchema),
		{name: "GetListWithErrorAggregation", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			e := setupStore(t, be, withFixedPrefix("/"))
			s := etcd3.NewStoreWithUnsafeCorruptObjectDeletion(e.store, e.groupResource())
			storagetesting.RunTestGetListWithErrorAggregation(e.ctx, t, e.withTransformerOverride(s), corruptObjectErr())
		}},
		{name: "GetListWithoutErrorAggregation", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, false)
			e := setupStore(t, be, withFixedPrefix("/"))
			storagetesting.RunTestGetListWithoutErrorAggregation(e.ctx, t, e.withTransformerOverride(nil), corruptObjectErr())
		}},
		{name: "GuaranteedUpdate", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestGuaranteedUpdate(e.ctx, t, e.withPrefixTransformer(), e.checkStorageInvariants())
		}},
		simple("GuaranteedUpdateWithTTL", storagetesting.RunTestGuaranteedUpdateWithTTL),
		{name: "GuaranteedUpdateChecksStoredData", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestGuaranteedUpdateChecksStoredData(e.ctx, t, e.withPrefixTransformer())
		}},
		simple("GuaranteedUpdateWithConflict", storagetesting.RunTestGuaranteedUpdateWithConflict),
		simple("GuaranteedUpdateWithSuggestionAndConflict", storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict),
		{name: "TransformationFailure", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestTransformationFailure(e.ctx, t, e.withPrefixTransformer())
		}},
	}
	for _, rs := range []bool{false, true} {
		rs := rs
		cs = append(cs,
			testCase{name: fmt.Sprintf("List/rangeStream=%v", rs), run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				e := setupStore(t, be)
				storagetesting.RunTestList(e.ctx, t, e.store, e.compactStorage(listFromCacheSnapshot()), false, e.kubeRecorder())
				streamReads := e.kvRecorder().GetStreamReadsAndReset()
				if rs && streamReads == 0 {
					t.Error("expected lists to be served by RangeStream")
				}
				if !rs && streamReads > 0 {
					t.Errorf("expected no RangeStream requests with the feature disabled, got %d", streamReads)
				}
			}},
			testCase{name: fmt.Sprintf("ConsistentList/rangeStream=%v", rs), run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				e := setupStore(t, be)
				storagetesting.RunTestConsistentList(e.ctx, t, e.store, increaseRVFunc(e.client.Client), false, true, false)
			}},
		)
	}
	cs = append(cs,
		testCase{name: "GetListStreamMultiChunk", run: runGetListStreamMultiChunk},
		testCase{name: "GetCurrentResourceVersion", run: runGetCurrentResourceVersion},
		testCase{name: "CompactRevision", run: func(t *testing.T, be backend) {
			gate(t, features.ListFromCacheSnapshot, true)
			e := setupStore(t, be)
			storagetesting.RunTestCompactRevision(e.ctx, t, e.store, increaseRVFunc(e.client.Client), e.compactStorage(true))
		}},
		testCase{name: "ListContinuation", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestListContinuation(e.ctx, t, e.store, e.checkStorageCallsInvariants())
		}},
		testCase{name: "ListPaginationRareObject", run: func(t *testing.T, be backend) {
			gate(t, features.ListFromCacheSnapshot, false)
			e := setupStore(t, be)
			storagetesting.RunTestListPaginationRareObject(e.ctx, t, e.store, e.checkStorageCallsInvariants())
		}},
		testCase{name: "ListContinuationWithFilter", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestListContinuationWithFilter(e.ctx, t, e.store, e.checkStorageCallsInvariants())
		}},
		simple("NamespaceScopedList", storagetesting.RunTestNamespaceScopedList),
		testCase{name: "ListInconsistentContinuation", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestListInconsistentContinuation(e.ctx, t, e.store, e.compactStorage(listFromCacheSnapshot()))
		}},
		testCase{name: "ListResourceVersionMatch", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestListResourceVersionMatch(e.ctx, t, e.withPrefixTransformer())
		}},
	)
	for _, sized := range []bool{true, false} {
		sized := sized
		cs = append(cs, testCase{name: fmt.Sprintf("Stats/SizeBasedListCostEstimate=%v", sized), run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			if sized {
				if err := e.store.EnableResourceSizeEstimation(e.getKeys); err != nil {
					t.Fatal(err)
				}
			}
			storagetesting.RunTestStats(e.ctx, t, e.store, e.codec, e.swap, sized)
		}})
	}

	// watcher_test.go
	cs = append(cs,
		simple("Watch/Watch", storagetesting.RunTestWatch),
		simple("Watch/ClusterScopedWatch", storagetesting.RunTestClusterScopedWatch),
		simple("Watch/NamespaceScopedWatch", storagetesting.RunTestNamespaceScopedWatch),
		simple("Watch/DeleteTriggerWatch", storagetesting.RunTestDeleteTriggerWatch),
		testCase{name: "Watch/WatchFromZero", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestWatchFromZero(e.ctx, t, e.store, e.compactStorage(listFromCacheSnapshot()))
		}},
		simple("Watch/WatchFromNonZero", storagetesting.RunTestWatchFromNonZero),
		simple("Watch/DelayedWatchDelivery", storagetesting.RunTestDelayedWatchDelivery),
		testCase{name: "Watch/WatchError", run: func(t *testing.T, be backend) {
			e := setupStore(t, be)
			storagetesting.RunTestWatchError(e.ctx, t, e.withPrefixTransformer())
		}},
		simple("Watch/WatchContextCancel", storagetesting.RunTestWatchContextCancel),
		simple("Watch/WatcherTimeout", storagetesting.RunTestWatcherTimeout),
		simple("Watch/WatchDeleteEventObjectHaveLatestRV", storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV),
		simple("Watch/WatchInitializationSignal", storagetesting.RunTestWatchInitializationSignal),
		testCase{name: "Watch/ProgressNotify", run: func(t *testing.T, be backend) {
			e := setupStore(t, be, withProgressNotify(time.Second))
			storagetesting.RunOptionalTestProgressNotify(e.ctx, t, e.store, increaseRVFunc(e.client.Client))
		}},
		testCase{name: "Watch/WatchWithUnsafeDelete", run: func(t *testing.T, be backend) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, true)
			e := setupStore(t, be)
			storagetesting.RunTestWatchWithUnsafeDelete(e.ctx, t, e.withTransformerOverride(nil), corruptObjectErr())
		}},
		testCase{name: "Watch/WatchDispatchBookmarkEvents", run: func(t *testing.T, be backend) {
			e := setupStore(t, be, withProgressNotify(time.Second))
			storagetesting.RunTestWatchDispatchBookmarkEvents(e.ctx, t, e.store, false)
		}},
		simple("Watch/SendInitialEventsBackwardCompatibility", storagetesting.RunSendInitialEventsBackwardCompatibility),
	)
	for _, rs := range []bool{false, true} {
		rs := rs
		p := fmt.Sprintf("Watch/RangeStream=%v/", rs)
		cs = append(cs,
			testCase{name: p + "WatchSemantics", run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				e := setupStore(t, be)
				storagetesting.RunWatchSemantics(e.ctx, t, e.store)
			}},
			testCase{name: p + "WatchSemanticsWithConcurrentDecode", run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				gate(t, features.ConcurrentWatchObjectDecode, true)
				e := setupStore(t, be)
				storagetesting.RunWatchSemantics(e.ctx, t, e.store)
			}},
			testCase{name: p + "WatchSemanticInitialEventsExtended", run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				e := setupStore(t, be)
				storagetesting.RunWatchSemanticInitialEventsExtended(e.ctx, t, e.store)
			}},
			testCase{name: p + "WatchListMatchSingle", run: func(t *testing.T, be backend) {
				gate(t, features.EtcdRangeStream, rs)
				e := setupStore(t, be)
				storagetesting.RunWatchListMatchSingle(e.ctx, t, e.store)
			}},
		)
	}
	cs = append(cs, testCase{name: "Watch/WatchErrorEventIsBlockingFurtherEvent", run: func(t *testing.T, be backend) {
		e := setupStore(t, be)
		storagetesting.RunWatchErrorIsBlockingFurtherEvents(e.ctx, t, e.withPrefixTransformer())
	}})
	return cs
}

func listFromCacheSnapshot() bool {
	return utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot)
}

// runGetListStreamMultiChunk is store_test.go's TestGetListStreamMultiChunk:
// GetList over the RangeStream RPC (etcd 3.7), consistent, exact and
// not-older-than.
func runGetListStreamMultiChunk(t *testing.T, be backend) {
	gate(t, features.EtcdRangeStream, true)
	e := setupStore(t, be)
	ctx, st, kvRecorder := e.ctx, e.store, e.kvRecorder()
	const podCount = 25
	for i := range podCount {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%02d", i)}}
		if err := st.Create(ctx, fmt.Sprintf("/pods/ns/pod-%02d", i), pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	streamedList := func(t *testing.T, rv string, rvMatch metav1.ResourceVersionMatch) *example.PodList {
		t.Helper()
		out := &example.PodList{}
		opts := storage.ListOptions{ResourceVersion: rv, ResourceVersionMatch: rvMatch, Predicate: storage.Everything, Recursive: true}
		if err := st.GetList(ctx, "/pods/", opts, out); err != nil {
			t.Fatalf("GetList failed: %v", err)
		}
		if streams := kvRecorder.GetStreamReadsAndReset(); streams == 0 {
			t.Error("expected the list to be served by RangeStream")
		}
		if out.Continue != "" || out.RemainingItemCount != nil {
			t.Errorf("streamed list must not paginate, got continue %q, remainingItemCount %v", out.Continue, out.RemainingItemCount)
		}
		return out
	}
	snapshot := streamedList(t, "", "")
	if len(snapshot.Items) != podCount {
		t.Errorf("consistent list returned %d items, want %d", len(snapshot.Items), podCount)
	}
	extraPod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-extra"}}
	if err := st.Create(ctx, "/pods/ns/pod-extra", extraPod, &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	exact := streamedList(t, snapshot.ResourceVersion, metav1.ResourceVersionMatchExact)
	if len(exact.Items) != podCount {
		t.Errorf("exact list returned %d items, want %d", len(exact.Items), podCount)
	}
	if exact.ResourceVersion != snapshot.ResourceVersion {
		t.Errorf("exact list returned resourceVersion %s, want %s", exact.ResourceVersion, snapshot.ResourceVersion)
	}
	notOlder := streamedList(t, snapshot.ResourceVersion, "")
	if len(notOlder.Items) != podCount+1 {
		t.Errorf("notOlderThan list returned %d items, want %d", len(notOlder.Items), podCount+1)
	}
}

// runGetCurrentResourceVersion is store_test.go's TestGetCurrentResourceVersion.
func runGetCurrentResourceVersion(t *testing.T, be backend) {
	e := setupStore(t, be)
	ctx, st := e.ctx, e.store
	versioner := storage.APIObjectVersioner{}
	pod := &example.Pod{}
	require.NoError(t, st.Create(ctx, "/pods/ns/pod-1", &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-1"}}, pod, 0))
	current, err := st.GetCurrentResourceVersion(ctx)
	require.NoError(t, err)
	podRV, err := versioner.ParseResourceVersion(pod.ResourceVersion)
	require.NoError(t, err)
	require.Equal(t, current, podRV, "expected the global etcd RV to be equal to pod's RV")
	resp, err := e.client.KV.Put(ctx, "compact_rev_key", pod.ResourceVersion)
	require.NoError(t, err)
	current, err = st.GetCurrentResourceVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, current, uint64(resp.Header.Revision), "expected the global etcd RV to be equal to the last write's revision")
	got := &example.Pod{}
	require.NoError(t, st.Get(ctx, "/pods/ns/pod-1", storage.GetOptions{}, got))
	gotRV, err := versioner.ParseResourceVersion(got.ResourceVersion)
	require.NoError(t, err)
	require.Equal(t, gotRV, podRV, "didn't expect to see the pod's RV changed")
}
