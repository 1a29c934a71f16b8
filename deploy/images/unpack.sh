#!/usr/bin/env bash
# Unpacks the root filesystem of an image archive made by deploy/images/build.sh:
#
#   deploy/images/unpack.sh <archive.oci.tar> <dir> [tag]
#
# <dir> becomes an OCI runtime bundle (umoci unpack --rootless): <dir>/rootfs holds the image's files,
# owned by the invoking user, and <dir>/config.json the runtime config. Prints the rootfs path.
# [tag] defaults to the archive's only tag. <dir> must be absent or empty.
set -euo pipefail
(($# == 2 || $# == 3)) || { echo "usage: $0 <archive.oci.tar> <dir> [tag]" >&2; exit 2; }
archive="$1" dir="$2" tag="${3:-}"
[[ -f $archive ]] || { echo "no such archive: $archive" >&2; exit 1; }
command -v umoci >/dev/null || { echo "umoci is missing: run .ci/system-deps.sh (Debian package umoci)" >&2; exit 1; }
if [[ -e $dir ]] && [[ -n "$(ls -A "$dir")" ]]; then
  echo "$dir is not empty" >&2
  exit 1
fi

layout="$(mktemp -d)"
trap 'rm -rf "$layout"' EXIT
tar -C "$layout" -xf "$archive"
if [[ -z $tag ]]; then
  mapfile -t tags < <(umoci ls --layout "$layout")
  ((${#tags[@]} == 1)) || { echo "$archive has tags [${tags[*]}]: name one" >&2; exit 1; }
  tag="${tags[0]}"
fi
umoci unpack --rootless --image "$layout:$tag" "$dir" >&2
echo "$(cd "$dir/rootfs" && pwd)"
