#!/usr/bin/env bash
# run.sh — what `make conformance` runs: the k8s.io/apiserver storage suite
# against fdb-etcd and an embedded etcd (reference), then the kube-apiserver
# scenarios. Reports go to $CONFORMANCE_RESULTS (default ./results).
# CONFORMANCE_SKIP=storage|scenarios skips one half.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${CONFORMANCE_RESULTS:-$PWD/results}"
mkdir -p "$results"
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
ever="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
echo "apiserver-conformance: Kubernetes $kver (k8s.io/apiserver ${kver/v1./v0.}), reference etcd $ever, $(go version)"
skip="${CONFORMANCE_SKIP:-}"
rc=0
start=$(date +%s)
if [ "$skip" != "scenarios" ]; then
  # Built before the tests so the build time is not charged to a test timeout.
  kubebin="$(hack/build-kube.sh | tail -n1)"
  echo "apiserver-conformance: kube binaries in $kubebin ($(( $(date +%s) - start ))s)"
fi
if [ "$skip" != "storage" ]; then
  t0=$(date +%s)
  go test -count=1 -timeout 40m ./storage -args -table "$results/storage.md" || rc=1
  echo "apiserver-conformance: storage suite took $(( $(date +%s) - t0 ))s"
fi
if [ "$skip" != "scenarios" ]; then
  t0=$(date +%s)
  KUBE_BIN_DIR="$kubebin" go test -count=1 -timeout 45m ./scenarios -args -report "$results/scenarios.md" || rc=1
  echo "apiserver-conformance: scenarios took $(( $(date +%s) - t0 ))s"
fi
for f in "$results/storage.md" "$results/scenarios.md"; do
  if [ -f "$f" ]; then echo; cat "$f"; fi
done
echo
echo "apiserver-conformance: Kubernetes $kver, $(( $(date +%s) - start ))s in all, $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
