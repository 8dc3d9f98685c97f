#!/usr/bin/env bash
# matrix.sh — what `make conformance-all` runs: hack/run.sh (the storage
# suite and the scenarios) for every supported Kubernetes minor, one after
# the other, the pinned one in this module and the others through
# hack/kube-version.sh (kube binaries built once per version, niced, and
# cached). Each version's reports and log go to $CONFORMANCE_RESULTS/<version>/
# (default ./results), the table of all of them to
# $CONFORMANCE_RESULTS/matrix.md. KUBE_VERSIONS overrides the list.
# Exit status 1 if any version failed or did not run its storage suite.
set -uo pipefail
cd "$(dirname "$0")/.."
pinned="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
versions="${KUBE_VERSIONS:-v1.34.4 v1.35.4 v1.36.3 $pinned}"
results="${CONFORMANCE_RESULTS:-$PWD/results}"
mkdir -p "$results"
matrix="$results/matrix.md"

# storage_counts and scenario_counts print the fdb-etcd column's counts of
# a report: the storage table's summary line, the scenario table's cells.
storage_counts() {
  sed -n 's/.*fdb-etcd: \([0-9]* passed, [0-9]* failed, [0-9]* skipped\).*/\1/p' "$1" | tail -n1
}
scenario_counts() {
  awk -F'|' '/^\| [A-Za-z]/ && $2 !~ /scenario/ {
      c = $3; gsub(/^ +| +$/, "", c)
      if (c ~ /^PASS/) p++; else if (c ~ /^FAIL/) f++; else s++
    } END { printf "%d passed, %d failed, %d not run\n", p, f, s }' "$1"
}

{
  echo "## apiserver-conformance on every supported Kubernetes minor"
  echo
  echo "| Kubernetes | reference etcd | storage suite (fdb-etcd) | scenarios (fdb-etcd) | took | result |"
  echo "|---|---|---|---|---|---|"
} > "$matrix"
rc=0
for v in $versions; do
  out="$results/$v"
  mkdir -p "$out"
  rm -f "$out/storage.md" "$out/scenarios.md"
  echo "conformance-all: Kubernetes $v (log: $out/run.log)"
  start=$(date +%s)
  if [ "$v" = "$pinned" ]; then
    CONFORMANCE_RESULTS="$out" hack/run.sh > "$out/run.log" 2>&1
  else
    CONFORMANCE_RESULTS="$out" hack/kube-version.sh "$v" > "$out/run.log" 2>&1
  fi
  vrc=$?
  took="$(( ($(date +%s) - start) / 60 )) min"
  etcdver="$(sed -n 's/.*reference etcd \(v[^,]*\),.*/\1/p' "$out/run.log" | head -n1)"
  st="not run"; sc="not run"
  [ -f "$out/storage.md" ] && st="$(storage_counts "$out/storage.md")"
  [ -f "$out/scenarios.md" ] && sc="$(scenario_counts "$out/scenarios.md")"
  result=PASS
  if [ $vrc -ne 0 ] || [ ! -f "$out/storage.md" ] || [ ! -f "$out/scenarios.md" ]; then
    result=FAIL
    rc=1
  fi
  echo "| $v | ${etcdver:-?} | $st | $sc | $took | $result |" >> "$matrix"
  echo "conformance-all: Kubernetes $v: storage $st; scenarios $sc; $took; $result"
  if [ "$result" = FAIL ]; then tail -n 30 "$out/run.log"; fi
done
echo
cat "$matrix"
exit $rc
