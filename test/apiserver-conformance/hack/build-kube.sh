#!/usr/bin/env bash
# build-kube.sh [binary...] — builds kube-apiserver, kube-controller-manager
# and kube-scheduler at the Kubernetes version this module pins, into
# $KUBE_BIN_CACHE (default $HOME/.cache/fdb-etcd/kube-<version>-<goos>-<goarch>),
# and prints that directory on its last line. Binaries already there are reused:
# a fresh 2-core machine needs ~15-25 min for all three, a warm one none.
# KUBE_GOMOD names another go.mod to build from (see hack/kube-version.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
moddir="${KUBE_MODDIR:-$here}"
cd "$moddir"
ver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
dir="${KUBE_BIN_CACHE:-${HOME}/.cache/fdb-etcd/kube-${ver}-$(go env GOOS)-$(go env GOARCH)}"
mkdir -p "$dir"
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(kube-apiserver kube-controller-manager kube-scheduler)
minor="${ver#v1.}"; minor="${minor%%.*}"
ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$ver -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for b in "${bins[@]}"; do
  if [ -x "$dir/$b" ]; then
    echo "build-kube: reusing cached $dir/$b" >&2
    continue
  fi
  echo "build-kube: building $b $ver (slow on a fresh machine) ..." >&2
  start=$(date +%s)
  nice -n 5 go build -trimpath -ldflags "-s -w$ld" -o "$dir/$b.tmp.$$" "k8s.io/kubernetes/cmd/$b"
  mv "$dir/$b.tmp.$$" "$dir/$b"
  echo "build-kube: built $b in $(( $(date +%s) - start ))s" >&2
done
echo "$dir"
