#!/usr/bin/env bash
# kube-version.sh VERSION [COMMAND...] — runs COMMAND (default: hack/run.sh)
# in a temporary copy of this module whose go.mod is rewritten to
# k8s.io/kubernetes VERSION (e.g. v1.36.3, v1.35.4, v1.34.4), every
# k8s.io/<staging> module replaced by the matching v0.X.Y, and the reference
# etcd at the version that Kubernetes release uses. The kube binaries are
# cached per version like the pinned ones. Example:
#   hack/kube-version.sh v1.36.3
#   CONFORMANCE_SKIP=storage hack/kube-version.sh v1.34.4
set -euo pipefail
ver="${1:?usage: kube-version.sh v1.X.Y [command...]}"; shift || true
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/apiserver-conformance-$ver-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -C "$here" --exclude=./results -cf - . | tar -C "$tmp" -xf -
cd "$tmp"
pinned="$(sed -n 's#^require k8s.io/kubernetes \(v[^ ]*\)#\1#p; s#^[[:space:]]*k8s.io/kubernetes \(v[^ ]*\).*#\1#p' go.mod | head -n1)"
if [ "${pinned%.*}" != "${ver%.*}" ] && [ -z "${CONFORMANCE_STORAGE:-}" ]; then
  # storage/ follows k8s.io/apiserver/pkg/storage/testing of the pinned
  # release, whose exported API changes every release: scenarios only.
  echo "kube-version: $ver differs from the pinned $pinned: storage suite left out (CONFORMANCE_STORAGE=1 keeps it)" >&2
  rm -rf storage
  export CONFORMANCE_SKIP=storage
fi
kmod="$(go mod download -json "k8s.io/kubernetes@$ver" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[ -n "$kmod" ] || { echo "kube-version: k8s.io/kubernetes@$ver not found" >&2; exit 1; }
etcdver="$(sed -n 's#^[[:space:]]*go.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$kmod" | head -n1)"
{
  printf 'module github.com/fdb-etcd/fdb-etcd/test/apiserver-conformance\n\ngo 1.26.0\n\n'
  hack/gomod.sh "$ver" "$kmod"
  echo
  [ -n "$etcdver" ] && echo "require go.etcd.io/etcd/server/v3 $etcdver"
  printf '\ntool (\n\tk8s.io/kubernetes/cmd/kube-apiserver\n\tk8s.io/kubernetes/cmd/kube-controller-manager\n\tk8s.io/kubernetes/cmd/kube-scheduler\n)\n'
} > go.mod
rm -f go.sum
go mod tidy
echo "kube-version: module copy in $tmp pinned to Kubernetes $ver (etcd ${etcdver:-?})" >&2
export FDB_ETCD_REPO="$repo"
if [ $# -eq 0 ]; then set -- hack/run.sh; fi
CONFORMANCE_RESULTS="${CONFORMANCE_RESULTS:-$here/results/$ver}" "$@"
