#!/usr/bin/env bash
# Helm reads only files inside the chart, so the chart carries copies of the project's CRDs and
# alert rules in kkp-quota/files/. This script refreshes the copies; with --check it writes
# nothing and fails when a copy differs from its source (run it after `make crds` or after
# editing deploy/prometheus/kkp-quota.rules.yaml).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deploy=$(cd "$here/.." && pwd)
files="$here/kkp-quota/files"
sources=(
  "$deploy/crds/projectquotas.kkp-quota.dev.yaml"
  "$deploy/crds/quotaledgers.kkp-quota.dev.yaml"
  "$deploy/crds/quotagroups.kkp-quota.dev.yaml"
  "$deploy/prometheus/kkp-quota.rules.yaml"
)

if [[ "${1:-}" == "--check" ]]; then
  stale=0
  for src in "${sources[@]}"; do
    copy="$files/$(basename "$src")"
    if ! cmp -s "$src" "$copy"; then
      echo "chart copy ${copy#"$deploy/"} differs from ${src#"$deploy/"}; run deploy/charts/sync-files.sh" >&2
      stale=1
    fi
  done
  exit "$stale"
fi

mkdir -p "$files"
for src in "${sources[@]}"; do
  cp "$src" "$files/"
done
echo "copied ${#sources[@]} files into ${files#"$deploy/"}" >&2
