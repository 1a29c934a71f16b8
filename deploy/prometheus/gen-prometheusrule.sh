#!/usr/bin/env bash
# Writes prometheusrule.yaml (Prometheus Operator) from the plain rules file kkp-quota.rules.yaml.
set -euo pipefail
cd "$(dirname "$0")"
{
  sed -n '1,9p' prometheusrule.yaml
  grep -v '^#' kkp-quota.rules.yaml | sed 's/^/  /'
} > prometheusrule.yaml.tmp
mv prometheusrule.yaml.tmp prometheusrule.yaml
