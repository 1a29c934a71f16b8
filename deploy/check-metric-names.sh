#!/usr/bin/env bash
# Every metric that an alert rule or a dashboard query uses must be one docs/metrics.md documents (its
# "Metrics" table), so the rules and the dashboard load nothing that does not exist. The live
# alerting test (e2e/tests/alerting.rs) checks the other half: the components export them.
set -euo pipefail
cd "$(dirname "$0")/.."
documented=$(sed -n '/^## Metrics/,/^## /p' docs/metrics.md | grep -o '^| `kkp_quota_[a-z_]*`' | tr -d '|` ' | sort -u)
[[ -n "$documented" ]] || { echo "docs/metrics.md has no Metrics table"; exit 1; }
used=$(grep -ho 'kkp_quota_[a-z_]*' deploy/prometheus/kkp-quota.rules.yaml deploy/grafana/kkp-quota-dashboard.json \
  | sed -E 's/_(bucket|sum|count)$//' | sort -u)
passed=0 failed=0
for metric in $used; do
  if grep -qx "$metric" <<<"$documented"; then
    passed=$((passed + 1))
  else
    echo "not documented in docs/metrics.md's Metrics table: $metric"
    failed=$((failed + 1))
  fi
done
echo "metric names: $passed passed, $failed failed"
((failed == 0))
