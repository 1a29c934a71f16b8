#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd, a node's kube-scheduler, kubelet and
# kube-proxy, and kubectl from their published Go modules (wrapper modules beside this script)
# into a cache directory keyed by version, and prints the directory that holds them.
#
#   KUBEBUILDER_ASSETS=/dir   use the binaries in /dir, build nothing (the envtest convention)
#   KKP_QUOTA_CACHE=/dir      cache root (default: ${XDG_CACHE_HOME:-~/.cache}/kkp-quota)
#
# Progress goes to stderr; the only line on stdout is the binaries' directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for bin in kube-apiserver etcd; do
    [[ -x "$KUBEBUILDER_ASSETS/$bin" ]] || { echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $bin" >&2; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

cache_root=${KKP_QUOTA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kkp-quota}
out="$cache_root/control-plane/kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}"
mkdir -p "$out"
# One build at a time per cache: concurrent callers (parallel test runs, several checkouts)
# would otherwise each build the same binaries into the same temporary file.
exec 9>"$out/.build.lock"
flock 9

build() { # name, wrapper dir, package, extra ldflags
  local name=$1 dir=$2 pkg=$3 ldflags=$4
  if [[ -x "$out/$name" ]]; then
    echo "control-plane: $name cached at $out/$name" >&2
    return
  fi
  echo "control-plane: building $name ($pkg) — several minutes on a cold cache" >&2
  local start=$SECONDS
  (cd "$here/$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w $ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name" # only a complete binary lands under its real name
  echo "control-plane: built $name in $((SECONDS - start))s" >&2
}

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
cb=k8s.io/component-base/version
build etcd etcd go.etcd.io/etcd/server/v3 ""
kube_ldflags="-X $cb.gitVersion=${KUBE_VERSION} -X $cb.gitMajor=1 -X $cb.gitMinor=${minor} -X $cb.gitTreeState=clean"
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
# From the same module and version: the fleet runs its garbage collector and namespace controller.
build kube-controller-manager kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
# The node that runs the chart as pods (e2e/src/node): scheduler, kubelet and kube-proxy.
build kube-scheduler kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
build kubelet kube-apiserver k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
build kube-proxy kube-apiserver k8s.io/kubernetes/cmd/kube-proxy "$kube_ldflags"
# kubectl, for the tests that read what a user sees (warnings, dry-run answers).
build kubectl kube-apiserver k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
echo "$out"
