#!/usr/bin/env bash
# matrix.sh — what `make conformance-all` runs: hack/run.sh (the storage
# suite and the scenarios) for every supported Kubernetes minor, one after
# the other, the pinned one in this module and the others through
# hack/kube-version.sh (kube binaries built once per version, niced, and
# cached). Each version's reports, log and status go to
# $CONFORMANCE_RESULTS/<version>/ (default ./results). KUBE_VERSIONS runs
# only those (e.g. one to run again; set and empty: none, the table only);
# the table in $CONFORMANCE_RESULTS/matrix.md covers every supported version
# with results.
# Exit status 1 if a version run now failed or did not run its storage suite.
set -uo pipefail
cd "$(dirname "$0")/.."
pinned="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
supported="v1.34.4 v1.35.4 v1.36.3 $pinned"
versions="${KUBE_VERSIONS-$supported}"
results="${CONFORMANCE_RESULTS:-$PWD/results}"
mkdir -p "$results"

# storage_counts prints one store's counts from a storage report's summary
# line ("fdb-etcd: 118 passed, 0 failed, 0 skipped. fdb-etcd-fdb: ..."),
# "not run" when that store did not run.
storage_counts() {
  local c
  c="$(grep -o "$2: [0-9]* passed, [0-9]* failed, [0-9]* skipped" "$1" | tail -n1)"
  if [ -n "$c" ]; then echo "${c#"$2: "}"; else echo "not run"; fi
}
# scenario_counts prints the counts of the scenario table's column whose
# title starts with $2, "not run" when the table has no such column.
scenario_counts() {
  awk -F'|' -v title="$2" '/^\| scenario \|/ {
      for (i = 3; i < NF; i++) { h = $i; gsub(/^ +| +$/, "", h); if (index(h, title) == 1) col = i }
      table = 1; next
    }
    table && !/^\|/ { exit }
    table && col && /^\| [A-Za-z]/ {
      c = $col; gsub(/^ +| +$/, "", c)
      if (c ~ /^PASS/) p++; else if (c ~ /^FAIL/) f++; else s++
    } END {
      if (!col) print "not run"; else printf "%d passed, %d failed, %d not run\n", p, f, s
    }' "$1"
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

# row prints a version's line of the table and says whether it passed:
# the storage suite and the scenarios, each on fdb-etcd's embedded store
# and on three replicas on FoundationDB.
row() {
  local v="$1" out="$results/$1" vrc took etcdver result=PASS
  local st=("not run" "not run") sc=("not run" "not run")
  read -r vrc took < "$out/status"
  etcdver="$(sed -n 's/.*reference etcd \(v[^,]*\),.*/\1/p' "$out/run.log" | head -n1)"
  if [ -f "$out/storage.md" ]; then
    st=("$(storage_counts "$out/storage.md" fdb-etcd)" "$(storage_counts "$out/storage.md" fdb-etcd-fdb)")
  fi
  if [ -f "$out/scenarios.md" ]; then
    sc=("$(scenario_counts "$out/scenarios.md" "fdb-etcd (embedded)")" "$(scenario_counts "$out/scenarios.md" "fdb-etcd (FoundationDB")")
  fi
  if [ "$vrc" -ne 0 ] || [ ! -f "$out/storage.md" ] || [ ! -f "$out/scenarios.md" ]; then
    result=FAIL
  fi
  echo "| $v | ${etcdver:-?} | ${st[0]} | ${st[1]} | ${sc[0]} | ${sc[1]} | $took min | $result |"
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
  echo "| Kubernetes | reference etcd | storage suite, embedded | storage suite, FoundationDB | scenarios, embedded | scenarios, FoundationDB | took | result |"
  echo "|---|---|---|---|---|---|---|---|"
  for v in $supported; do
    if [ -f "$results/$v/status" ]; then row "$v"; fi
  done
} > "$results/matrix.md"
echo
cat "$results/matrix.md"
exit $rc
