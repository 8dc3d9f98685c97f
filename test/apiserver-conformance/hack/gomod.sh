#!/usr/bin/env bash
# gomod.sh KUBE_VERSION GOMOD_OF_K8S > go.mod-fragment
# Prints the require/replace block pinning k8s.io/kubernetes at KUBE_VERSION
# (e.g. v1.37.2) and every k8s.io/<staging> module at the matching v0.X.Y.
# It reads the staging list from k8s.io/kubernetes's own go.mod.
set -euo pipefail
kv="$1"; mod="$2"
sv="v0.${kv#v1.}"
echo "require k8s.io/kubernetes $kv"
echo
echo "replace ("
sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$mod" | sort -u | while read -r m; do
  echo "	$m => $m $sv"
done
echo ")"
