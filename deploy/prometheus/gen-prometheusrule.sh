#!/usr/bin/env bash
# Writes prometheusrule.yaml (Prometheus Operator) from the plain rules file kkp-quota.rules.yaml.
# With --check, writes nothing and fails when prometheusrule.yaml is not what it would write.
set -euo pipefail
cd "$(dirname "$0")"
generated=$(
  sed -n '1,9p' prometheusrule.yaml
  grep -v '^#' kkp-quota.rules.yaml | sed 's/^/  /'
)
if [[ "${1:-}" == "--check" ]]; then
  if [[ "$generated" != "$(cat prometheusrule.yaml)" ]]; then
    echo "prometheusrule.yaml differs from kkp-quota.rules.yaml; run deploy/prometheus/gen-prometheusrule.sh" >&2
    exit 1
  fi
  exit 0
fi
printf '%s\n' "$generated" > prometheusrule.yaml
