#!/usr/bin/env bash
# run.sh — what `make conformance` runs: the k8s.io/apiserver storage suite
# against fdb-etcd and an embedded etcd (reference), then the kube-apiserver
# scenarios. fdb-etcd runs on its embedded store and, with CONFORMANCE_FDB=1
# (make conformance sets it when it finds FoundationDB; unset: when fdbserver
# and fdbcli are on PATH), as three replicas on a throwaway fdbserver.
# Reports go to $CONFORMANCE_RESULTS (default ./results).
# CONFORMANCE_SKIP=storage|scenarios skips one half.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${CONFORMANCE_RESULTS:-$PWD/results}"
mkdir -p "$results"
rm -f "$results/storage.md" "$results/scenarios.md" "$results"/storage-*.json "$results"/storage-*.log
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
ever="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
echo "apiserver-conformance: Kubernetes $kver (k8s.io/apiserver ${kver/v1./v0.}), reference etcd $ever, $(go version), CONFORMANCE_FDB=${CONFORMANCE_FDB:-auto}"
skip="${CONFORMANCE_SKIP:-}"
rc=0
start=$(date +%s)
if [ "$skip" != "scenarios" ]; then
  # The kube binaries build (niced) while the storage suite runs; on a warm
  # machine build-kube.sh just finds them in its cache.
  hack/build-kube.sh > "$results/build-kube.out" 2> "$results/build-kube.log" &
  buildpid=$!
fi
if [ "$skip" != "storage" ]; then
  t0=$(date +%s)
  # The backends run side by side, each in a test process of its own (the
  # suite sets feature gates, which are process-wide): each mostly waits
  # for its servers to start. Their results make one table (-merge).
  bindir="$(mktemp -d)"
  go test -c -o "$bindir/storage.test" ./storage
  pids=() bes=() files=()
  for be in $(echo "${CONFORMANCE_BACKENDS:-etcd,fdb-etcd,fdb-etcd-fdb}" | tr ',' ' '); do
    (cd storage && exec "$bindir/storage.test" -test.count=1 -test.timeout=40m -backends "$be" -results "$results/storage-$be.json") \
      > "$results/storage-$be.log" 2>&1 &
    pids+=($!) bes+=("$be") files+=("$results/storage-$be.json")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      echo "apiserver-conformance: storage suite on ${bes[$i]}: PASS"
    else
      rc=1
      cat "$results/storage-${bes[$i]}.log"
      echo "apiserver-conformance: storage suite on ${bes[$i]}: FAIL (log above)"
    fi
  done
  (cd storage && "$bindir/storage.test" -merge "$(IFS=,; echo "${files[*]}")" -table "$results/storage.md") > /dev/null || rc=1
  rm -rf "$bindir"
  echo "apiserver-conformance: storage suite took $(( $(date +%s) - t0 ))s"
fi
if [ "$skip" != "scenarios" ]; then
  if ! wait "$buildpid"; then
    cat "$results/build-kube.log" >&2
    echo "apiserver-conformance: building the kube binaries failed" >&2
    exit 1
  fi
  cat "$results/build-kube.log"
  kubebin="$(tail -n1 "$results/build-kube.out")"
  echo "apiserver-conformance: kube binaries ready in $kubebin $(( $(date +%s) - start ))s after the start"
  t0=$(date +%s)
  # -parallel: the stores' stacks and the two-tenant run mostly wait (for
  # the apiserver's consistency checker, and the tenants for the stacks'
  # busy scenarios: busyStacks in scenarios/main_test.go), not on the CPU;
  # go test's default (GOMAXPROCS) would queue a stack behind a test that
  # only waits.
  KUBE_BIN_DIR="$kubebin" go test -count=1 -timeout 60m -parallel 16 ./scenarios -args -report "$results/scenarios.md" || rc=1
  echo "apiserver-conformance: scenarios took $(( $(date +%s) - t0 ))s"
fi
for f in "$results/storage.md" "$results/scenarios.md"; do
  if [ -f "$f" ]; then echo; cat "$f"; fi
done
echo
echo "apiserver-conformance: Kubernetes $kver, $(( $(date +%s) - start ))s in all, $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
