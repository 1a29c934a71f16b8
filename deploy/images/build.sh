#!/usr/bin/env bash
# Builds one OCI image per component without a daemon and without a base image:
#   target/images/kkp-quota-<component>.oci.tar   (a tar of an OCI image layout, tagged <version>)
# Each image holds only /usr/local/bin/<component> (static, 0755, root-owned), runs as 65532:65532,
# and has the component as its entrypoint. umoci runs with --rootless, so this works as any user.
#
#   deploy/images/build.sh [component...]     (default: all three)
#
# SOURCE_DATE_EPOCH fixes every timestamp in the images and archives (default: the last commit's
# time), so rebuilding the same binaries gives the same image digests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

all=(master-controller seed-controller machine-webhook)
components=("$@")
((${#components[@]})) || components=("${all[@]}")
for c in "${components[@]}"; do
  [[ " ${all[*]} " == *" $c "* ]] || { echo "unknown component: $c (one of: ${all[*]})" >&2; exit 2; }
done
command -v umoci >/dev/null || { echo "umoci is missing: run .ci/system-deps.sh (Debian package umoci)" >&2; exit 1; }

# [workspace.package] of Cargo.toml: version (the image tag and version label), repository, license.
workspace_field() {
  awk -v key="$1" '/^\[workspace\.package\]/ { s = 1; next } /^\[/ { s = 0 }
    s && $1 == key && $2 == "=" { gsub(/^[^"]*"|".*$/, ""); print; exit }' Cargo.toml
}
version="$(workspace_field version)" source_url="$(workspace_field repository)" license="$(workspace_field license)"
[[ -n $version && -n $source_url && -n $license ]] ||
  { echo "Cargo.toml's [workspace.package] needs version, repository and license" >&2; exit 1; }

epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || true)}"
epoch="${epoch:-0}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

# The root Dockerfile builds the same images in registries' pipelines, and cannot read Cargo.toml:
# keep its defaults and its COPY of every workspace member in step with the workspace.
toolchain="$(awk -F'"' '/^channel *=/ { print $2; exit }' rust-toolchain.toml)"
drift=()
grep -qxF "ARG VERSION=$version" Dockerfile || drift+=("ARG VERSION=$version")
grep -qxF "ARG SOURCE=$source_url" Dockerfile || drift+=("ARG SOURCE=$source_url")
grep -qxF "ARG RUST_VERSION=$toolchain" Dockerfile || drift+=("ARG RUST_VERSION=$toolchain")
for m in $(sed -n '/^members *=/,/]/p' Cargo.toml | tr -d ' \t\n"' | sed 's/^members=\[//; s/,*\].*//' | tr ',' ' '); do
  grep -qxF "COPY $m $m/" Dockerfile || drift+=("COPY $m $m/")
done
if ((${#drift[@]})); then
  printf 'Dockerfile is out of step with the workspace; it needs:\n' >&2
  printf '  %s\n' "${drift[@]}" >&2
  exit 1
fi

# 1. The static binaries (the same command the Dockerfile's builder stage runs).
deploy/images/static-build.sh
bindir="${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release"
out="${CARGO_TARGET_DIR:-target}/images"
mkdir -p "$out"
work="$(mktemp -d "$out/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

for c in "${components[@]}"; do
  bin="$bindir/$c"
  # A scratch image has no loader: refuse anything that asks for one.
  headers="$(LC_ALL=C readelf -lW "$bin")"
  if [[ $headers == *"Requesting program interpreter"* ]]; then
    echo "$bin is dynamically linked; a scratch image cannot run it" >&2
    exit 1
  fi

  # An empty image, unpacked to a bundle whose rootfs gets /usr/local/bin/<component> and nothing
  # else, then repacked as the one layer. (Not `umoci insert`: umoci 0.4.7, Debian bookworm's, writes
  # insert layers without the tar padding and end-of-archive blocks.) --rootless, recorded in the
  # bundle for repack, maps the invoking user to uid/gid 0, so the layer's files are root-owned.
  layout="$work/$c-layout" bundle="$work/$c-bundle"
  name="kkp-quota-$c"
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci unpack --rootless --image "$layout:$version" "$bundle"
  install -d -m 0755 "$bundle/rootfs/usr/local/bin"
  install -m 0755 "$bin" "$bundle/rootfs/usr/local/bin/$c"
  chmod 0755 "$bundle/rootfs"
  find "$bundle/rootfs" -exec touch -h -d "@$epoch" {} +
  umoci repack --image "$layout:$version" \
    --history.created "$created" --history.created_by "deploy/images/build.sh $c" \
    --history.comment "static $c $version" "$bundle"
  umoci config --image "$layout:$version" --no-history \
    --created "$created" --os linux --architecture amd64 \
    --config.user 65532:65532 \
    --config.entrypoint "/usr/local/bin/$c" \
    --config.workingdir / \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.source=$source_url" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.licenses=$license" \
    --manifest.annotation "org.opencontainers.image.title=$name" \
    --manifest.annotation "org.opencontainers.image.version=$version" \
    --manifest.annotation "org.opencontainers.image.created=$created"
  umoci gc --layout "$layout"

  # The archive: the layout's files in a fixed order, with fixed owners and times.
  archive="$out/$name.oci.tar"
  chmod -R u=rwX,go=rX "$layout"
  find "$layout" -exec touch -h -d "@$epoch" {} +
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$layout" -cf "$work/$name.oci.tar" oci-layout index.json blobs
  mv "$work/$name.oci.tar" "$archive"
  echo "$archive ($name:$version, $(du -h "$archive" | cut -f1))"
done

# The kubectl plugin, released beside the images: a tar.gz holding the static binary, and the
# krew manifest (deploy/krew/kkp-quota.yaml) with its version, URL and sha256 filled in.
plugin="kubectl-kkp_quota"
plugin_archive="$out/$plugin-linux-amd64.tar.gz"
install -d -m 0755 "$work/plugin"
install -m 0755 "$bindir/$plugin" "$work/plugin/$plugin"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$work/plugin" -cf - "$plugin" | gzip -n -9 >"$plugin_archive"
sha="$(sha256sum "$plugin_archive" | cut -d' ' -f1)"
sed -e "s|@VERSION@|$version|g" -e "s|@SOURCE@|$source_url|g" \
  -e "s|@URI@|$source_url/releases/download/v$version/$plugin-linux-amd64.tar.gz|g" \
  -e "s|@SHA256@|$sha|g" deploy/krew/kkp-quota.yaml >"$out/kkp-quota.krew.yaml"
echo "$plugin_archive ($plugin $version, sha256 $sha) and $out/kkp-quota.krew.yaml"
