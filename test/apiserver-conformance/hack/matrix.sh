#!/usr/bin/env bash
# matrix.sh — what `make conformance-all` runs: hack/run.sh (the storage
# suite and the scenarios) for every supported Kubernetes minor, one after
# the other, the pinned one in this module and the others through
# hack/kube-version.sh (kube binaries built once per version, niced, and
# cached). Each version's reports, log and status go to
# $CONFORMANCE_RESULTS/<version>/ (default ./results). KUBE_VERSIONS runs
# only those (e.g. one to run again); the table in
# $CONFORMANCE_RESULTS/matrix.md covers every supported version with results.
# Exit status 1 if a version run now failed or did not run its storage suite.
set -uo pipefail
cd "$(dirname "$0")/.."
pinned="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
supported="v1.34.4 v1.35.4 v1.36.3 $pinned"
versions="${KUBE_VERSIONS:-$supported}"
results="${CONFORMANCE_RESULTS:-$PWD/results}"
mkdir -p "$results"

# storage_counts and scenario_counts print the fdb-etcd column's counts of
# a report: the storage table's summary line, the scenario table's cells.
storage_counts() {
  sed -n 's/.*fdb-etcd: \([0-9]* passed, [0-9]* failed, [0-9]* skipped\).*/\1/p' "$1" | tail -n1
}
scenario_counts() {
  awk -F'|' '/^\| scenario \|/ { table = 1; next }
    table && !/^\|/ { exit }
    table && /^\| [A-Za-z]/ {
      c = $3; gsub(/^ +| +$/, "", c)
      if (c ~ /^PASS/) p++; else if (c ~ /^FAIL/) f++; else s++
    } END { printf "%d passed, %d failed, %d not run\n", p, f, s }' "$1"
}

# run_version runs one version and leaves "exit-status minutes" in status.
run_version() {
  local v="$1" out="$results/$1" start vrc
  mkdir -p "$out"
  rm -f "$out/storage.md" "$out/scenarios.md" "$out/status"
  echo "conformance-all: Kubernetes $v (log: $out/run.log)"
  start=$(date +%s)
  if [ "$v" = "$pinned" ]; then
    CONFORMANCE_RESULTS="$out" hack/run.sh > "$out/run.log" 2>&1
  else
    CONFORMANCE_RESULTS="$out" hack/kube-version.sh "$v" > "$out/run.log" 2>&1
  fi
  vrc=$?
  echo "$vrc $(( ($(date +%s) - start) / 60 ))" > "$out/status"
}

# row prints a version's line of the table and says whether it passed.
row() {
  local v="$1" out="$results/$1" vrc took etcdver st="not run" sc="not run" result=PASS
  read -r vrc took < "$out/status"
  etcdver="$(sed -n 's/.*reference etcd \(v[^,]*\),.*/\1/p' "$out/run.log" | head -n1)"
  [ -f "$out/storage.md" ] && st="$(storage_counts "$out/storage.md")"
  [ -f "$out/scenarios.md" ] && sc="$(scenario_counts "$out/scenarios.md")"
  if [ "$vrc" -ne 0 ] || [ ! -f "$out/storage.md" ] || [ ! -f "$out/scenarios.md" ]; then
    result=FAIL
  fi
  echo "| $v | ${etcdver:-?} | $st | $sc | $took min | $result |"
  [ "$result" = PASS ]
}

rc=0
for v in $versions; do
  run_version "$v"
  if ! line="$(row "$v")"; then
    rc=1
    tail -n 30 "$results/$v/run.log"
  fi
  echo "conformance-all: $line"
done
{
  echo "## apiserver-conformance on every supported Kubernetes minor"
  echo
  echo "| Kubernetes | reference etcd | storage suite (fdb-etcd) | scenarios (fdb-etcd) | took | result |"
  echo "|---|---|---|---|---|---|"
  for v in $supported; do
    if [ -f "$results/$v/status" ]; then row "$v"; fi
  done
} > "$results/matrix.md"
echo
cat "$results/matrix.md"
exit $rc
