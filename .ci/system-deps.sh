#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing. Go and Rust come with the machine.
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus) # promtool, and the real Prometheus for the live alert test
command -v umoci >/dev/null || need+=(umoci) # daemonless OCI image assembly for `make images`
# The node that runs the chart as pods (e2e/src/node): container runtime, CNI plugins, and what
# kube-proxy programs the host with.
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v openssl >/dev/null || need+=(openssl) # the node test reads the served certificate
command -v gcc >/dev/null || need+=(gcc libc6-dev) # the node's static pause binary
command -v go >/dev/null || { echo "the Go toolchain is required to build kube-apiserver and etcd" >&2; exit 1; }
if ((${#need[@]})); then
  echo "installing: ${need[*]}" >&2
  if [[ $(id -u) -eq 0 ]]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
