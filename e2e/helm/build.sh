#!/usr/bin/env bash
# Builds helm from its published Go module (the wrapper module in ./helm, version in
# versions.env) into a cache directory keyed by version, and prints the binary's path.
#
#   KKP_QUOTA_HELM=/path/to/helm  use that helm, build nothing
#   KKP_QUOTA_CACHE=/dir          cache root (default: ${XDG_CACHE_HOME:-~/.cache}/kkp-quota)
#
# Progress goes to stderr; the only line on stdout is the helm binary's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

if [[ -n "${KKP_QUOTA_HELM:-}" ]]; then
  [[ -x "$KKP_QUOTA_HELM" ]] || { echo "KKP_QUOTA_HELM=$KKP_QUOTA_HELM is not an executable" >&2; exit 1; }
  echo "$KKP_QUOTA_HELM"
  exit 0
fi

cache_root=${KKP_QUOTA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kkp-quota}
out="$cache_root/helm/helm-${HELM_VERSION}"
bin="$out/helm"
if [[ -x "$bin" ]]; then
  echo "helm: cached at $bin" >&2
  echo "$bin"
  exit 0
fi
mkdir -p "$out"

# What helm's own Makefile stamps in: its version, and the Kubernetes version it assumes when no
# cluster is asked (`helm template`, `helm lint`), derived from the client-go it is built with.
client_go=$(sed -n 's#^\s*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$here/helm/go.mod")
[[ -n "$client_go" ]] || { echo "helm: no k8s.io/client-go in $here/helm/go.mod" >&2; exit 1; }
v=helm.sh/helm/v3/internal/version
ldflags="-s -w -X $v.version=${HELM_VERSION} -X $v.metadata= -X $v.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${client_go}"
done

echo "helm: building helm ${HELM_VERSION} (helm.sh/helm/v3/cmd/helm) — a few minutes on a cold cache" >&2
start=$SECONDS
(cd "$here/helm" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin.tmp" helm.sh/helm/v3/cmd/helm)
mv "$bin.tmp" "$bin" # only a complete binary lands under its real name
echo "helm: built $bin in $((SECONDS - start))s" >&2
echo "$bin"
