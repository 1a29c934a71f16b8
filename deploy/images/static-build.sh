#!/usr/bin/env bash
# Builds the three binaries and the kubectl plugin as static executables: glibc with crt-static on the gnu target (the musl
# target is not part of the toolchain here; TLS is rustls, so nothing links OpenSSL). Because
# --target is given, RUSTFLAGS reach only the target crates, not build scripts or proc macros.
# Used by deploy/images/build.sh and by the root Dockerfile's builder stage, so both build the same.
# Output: ${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/<component> and
# kubectl-kkp_quota.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export RUSTFLAGS="-C target-feature=+crt-static"
exec "${CARGO:-cargo}" build --release --locked --target x86_64-unknown-linux-gnu \
  -p master-controller -p seed-controller -p machine-webhook -p kubectl-kkp-quota
