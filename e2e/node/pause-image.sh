#!/usr/bin/env bash
# Builds the pod sandbox image of the fleet's node (the node reaches no registry, so it cannot pull
# one): pause.c, static, as the only file of an OCI image tagged 1, into the cache; prints the
# archive's path. containerd imports it as kkp-quota.local/pause:1 (e2e/src/node).
#
#   KKP_QUOTA_CACHE=/dir   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/kkp-quota)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KKP_QUOTA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kkp-quota}
out="$cache_root/node"
mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
# The cache key is the source: an edited pause.c gives a new archive.
key=$(sha256sum "$here/pause.c" "$0" | sha256sum | cut -c1-16)
archive="$out/pause-$key.oci.tar"
if [[ -s $archive ]]; then
  echo "$archive"
  exit 0
fi
command -v umoci >/dev/null || { echo "umoci is missing: run .ci/system-deps.sh" >&2; exit 1; }
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
gcc -static -Os -Wall -Werror -o "$work/pause" "$here/pause.c"
umoci init --layout "$work/layout"
umoci new --image "$work/layout:1"
umoci unpack --rootless --image "$work/layout:1" "$work/bundle"
install -m 0755 "$work/pause" "$work/bundle/rootfs/pause"
umoci repack --image "$work/layout:1" "$work/bundle"
umoci config --image "$work/layout:1" --os linux --architecture amd64 \
  --config.user 65535:65535 --config.entrypoint /pause
umoci gc --layout "$work/layout"
tar -C "$work/layout" -cf "$work/pause.oci.tar" oci-layout index.json blobs
mv "$work/pause.oci.tar" "$archive"
echo "$archive"
