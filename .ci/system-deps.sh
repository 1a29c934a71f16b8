#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing. Go and Rust come with the machine.
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus) # promtool, and the real Prometheus for the live alert test
command -v umoci >/dev/null || need+=(umoci) # daemonless OCI image assembly for `make images`
command -v go >/dev/null || { echo "the Go toolchain is required to build kube-apiserver and etcd" >&2; exit 1; }
if ((${#need[@]})); then
  echo "installing: ${need[*]}" >&2
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
