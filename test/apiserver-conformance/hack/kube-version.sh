#!/usr/bin/env bash
# kube-version.sh VERSION [COMMAND...] — runs COMMAND (default: hack/run.sh)
# in a temporary copy of this module whose go.mod is rewritten to
# k8s.io/kubernetes VERSION (e.g. v1.36.3, v1.35.4, v1.34.4), every
# k8s.io/<staging> module replaced by the matching v0.X.Y, and the reference
# etcd at the version that Kubernetes release uses. The kube binaries are
# cached per version like the pinned ones. Example:
#   hack/kube-version.sh v1.36.3
#   CONFORMANCE_SKIP=storage hack/kube-version.sh v1.34.4
# For a release before the pinned one, storage/ is adapted by the
# hack/storage-pre-v1.N.patch files (see adapt_storage); CONFORMANCE_STORAGE=1
# copies it unadapted.
set -euo pipefail
ver="${1:?usage: kube-version.sh v1.X.Y [command...]}"; shift || true
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/apiserver-conformance-$ver-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -C "$here" --exclude=./results -cf - . | tar -C "$tmp" -xf -
cd "$tmp"
pinned="$(sed -n 's#^require k8s.io/kubernetes \(v[^ ]*\)#\1#p; s#^[[:space:]]*k8s.io/kubernetes \(v[^ ]*\).*#\1#p' go.mod | head -n1)"
minor() { local m="${1#v1.}"; echo "${m%%.*}"; }
# adapt_storage applies to storage/, newest first, every
# hack/storage-pre-v1.N.patch with the pinned minor >= N > the target's
# minor: each adapts storage/ to the releases before N the way their own
# store_test.go, watcher_test.go and cacher_test.go differ (see its header).
# It fails when there is none for the pinned minor or one no longer applies.
adapt_storage() {
  local n p
  [ -f "$here/hack/storage-pre-v1.$(minor "$pinned").patch" ] || return 1
  for (( n = $(minor "$pinned"); n > $(minor "$ver"); n-- )); do
    p="$here/hack/storage-pre-v1.$n.patch"
    [ -f "$p" ] || continue
    git apply "$p" || { echo "kube-version: $p no longer applies to storage/: regenerate it (see its header)" >&2; return 1; }
    echo "kube-version: storage/ adapted by $(basename "$p")" >&2
  done
}
if [ "$(minor "$pinned")" != "$(minor "$ver")" ] && [ -z "${CONFORMANCE_STORAGE:-}" ]; then
  # storage/ follows k8s.io/apiserver/pkg/storage/testing of the pinned
  # release, whose exported API changes every release.
  if [ "$(minor "$ver")" -gt "$(minor "$pinned")" ] || ! adapt_storage; then
    echo "kube-version: storage suite left out for $ver (pinned: $pinned; CONFORMANCE_STORAGE=1 keeps it unadapted)" >&2
    rm -rf storage
    export CONFORMANCE_SKIP=storage
  fi
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
